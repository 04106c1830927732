"""The kinds are registered, not named: each declares its table, health, status keys and
metrics (kinds/registry.py), and the config file's tables and old flat keys set them."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from exitwatch.kinds import registry
from exitwatch.service.config import Config, ConfigError, load
from exitwatch.service.daemon import make_kinds
from exitwatch.service.status import build, text


def _file(tmp_path: Path, body: str) -> str:
    path = tmp_path / "config.toml"
    path.write_text(body)
    return str(path)


def test_every_kind_is_registered_once_with_a_table_whose_first_setting_is_enabled() -> None:
    assert [reg.kind for reg in registry.KINDS] == [
        *("container", "workdir", "hook", "lease", "watchdog", "process")
    ]
    assert len({reg.table for reg in registry.KINDS}) == len(registry.KINDS)
    for reg in registry.KINDS:
        first = fields(reg.settings)[0]
        assert (first.name, first.default) == ("enabled", True), reg.kind
        assert reg.settings().checks().keys() <= {f.name for f in fields(reg.settings)}
        for old, new in reg.aliases.items():
            assert new in {f.name for f in fields(reg.settings)}, (old, new)


def test_tables_set_each_kind_and_enabled_false_turns_it_off(tmp_path: Path) -> None:
    config = load(
        _file(
            tmp_path,
            '[workdirs]\nroots = ["/srv/a"]\ndepth = 5\n'
            "[processes]\nenabled = false\n[hooks]\nenabled = false\n"
            '[leases]\nenabled = false\n[watchdogs]\ndir = "/srv/dogs"\n',
        )
    )
    assert config.kind("workdirs").roots == ("/srv/a",) and config.kind("workdirs").depth == 5
    kinds = make_kinds(config)
    assert list(kinds) == ["container", "workdir", "watchdog"]
    assert kinds["watchdog"].path == "/srv/dogs"


def test_the_old_flat_keys_still_work_and_each_use_is_noted(tmp_path: Path) -> None:
    notes: list[str] = []
    body = 'workdir_roots = ["/srv/b"]\nkill_leftovers = false\nengine_concurrency = 4\n'
    config = load(_file(tmp_path, body), notes=notes)
    assert config.kind("workdirs").roots == ("/srv/b",)
    assert config.kind("processes").enabled is False
    assert config.kind("containers").concurrency == 4
    assert len(notes) == 3
    assert any("workdir_roots" in n and "roots in the [workdirs] table" in n for n in notes)


def test_a_tables_own_spelling_wins_over_its_old_flat_key(tmp_path: Path) -> None:
    notes: list[str] = []
    config = load(_file(tmp_path, "workdir_depth = 2\n[workdirs]\ndepth = 7\n"), notes=notes)
    assert config.kind("workdirs").depth == 7 and notes == []


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ("[workdirs]\ndepth = 99\n", "workdirs.depth: expected an integer in 1..16, got 99"),
        ("[processes]\nbogus = 1\n", "unknown key 'processes.bogus' (known in [processes]:"),
        ("[hooks]\ndir = 3\n", "hooks.dir: expected a string, got 3"),
        ("workdir_depth = 0\n", "workdirs.depth: expected an integer in 1..16, got 0"),
        ("containers = 1\n", "containers: expected a table ([containers]), got 1"),
        ('[containers]\ndocker_host = "tcp://h:2375"\n', "containers.docker_host: expected"),
    ],
)
def test_a_bad_table_is_one_line_naming_the_key(tmp_path: Path, body: str, said: str) -> None:
    path = _file(tmp_path, body)
    with pytest.raises(ConfigError) as err:
        load(path)
    assert str(err.value).startswith(f"{path}: {said}"), str(err.value)
    assert "\n" not in str(err.value)


def test_docker_host_naming_a_remote_engine_is_refused_when_the_kind_is_made(monkeypatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "tcp://elsewhere:2375")
    with pytest.raises(ConfigError, match=r"^containers\.docker_host: expected a local"):
        make_kinds(Config())


def test_status_shows_each_kinds_health_and_holdings_as_it_declares_them() -> None:
    doc = {
        "schema": build.SCHEMA,
        "agent": None,
        "docker": {"endpoint": "unix:///x.sock", "connected": False, "last_error": "refused"},
        "processes": {"interval_s": 1.0, "failing": 0, "unreadable": 3, "last_unreadable": "p"},
        "owners": [
            {
                "owner": "b:1:2",
                "pid": 1,
                "name": None,
                "containers": [{"id": "0123456789abcdef", "name": "web", "project": "p"}],
                "workdirs": ["/tmp/w"],
                "hooks": ["h1: curl"],
                "processes": ["process 7 (sleep)"],
            }
        ],
        "pending": [],
    }
    shown = text.render(doc)
    for line in (
        "  docker:   unix:///x.sock: DOWN (refused)",
        "  leftover processes: rescanned every 1 s",
        "    container 0123456789ab (web, project p)",
        "    workdir /tmp/w",
        "    hook h1: curl",
        "    process 7 (sleep)",
    ):
        assert line in shown.splitlines(), (line, shown)
    assert "BLIND to 3 processes" in shown
