"""The man pages and the conffile kept in step with the code: exitwatch(8) names every
command and option, exitwatch.toml(5) every setting with its default and its docstring,
exitwatch-run(1) the run's options and exit statuses; each renders without warnings, and
packaging/config.toml documents every setting with its default. system/test_deb.py builds
and installs the package."""

from __future__ import annotations

import importlib
import os
import re
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path

import click
import pytest

from exitwatch.cli import cli
from exitwatch.kinds import registry
from exitwatch.service import config as config_module
from exitwatch.service.config import TABLE, Adopt, Config

from support.packaging import PACKAGING, PAGES, man
from support.procs import run

ROOT = PACKAGING.parent


def _manpage_module():
    # As debian/rules runs it: a script beside mansource.py, which it imports.
    sys.path.insert(0, str(PACKAGING))
    try:
        return importlib.import_module("manpage")
    finally:
        sys.path.remove(str(PACKAGING))


def _commands(group: click.Group, path: str) -> Iterator[tuple[str, click.Command]]:
    for name, cmd in sorted(group.commands.items()):
        if cmd.hidden:
            continue
        yield f"{path} {name}", cmd
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, f"{path} {name}")


def test_man_page_lists_every_command_and_option() -> None:
    page = _manpage_module().render("exitwatch.8")
    sections = re.split(r'^\.SS "', page, flags=re.M)
    by_command = {s.split('"', 1)[0].split(" [")[0]: s for s in sections[1:]}
    for path, cmd in _commands(cli, "exitwatch"):
        escaped = path.replace("-", "\\-")
        assert escaped in by_command, f"{path} has no section in exitwatch(8)"
        for param in cmd.params:
            if isinstance(param, click.Option) and not param.hidden:
                for opt in (*param.opts, *param.secondary_opts):
                    assert opt.replace("-", "\\-") in by_command[escaped], (
                        f"{path} {opt} is missing from exitwatch(8)"
                    )
            elif isinstance(param, click.Argument):
                name = param.human_readable_name.replace("-", "\\-")
                assert name in by_command[escaped].splitlines()[0]
    assert "\\-\\-version" in page


@pytest.mark.parametrize("name", PAGES)
def test_man_page_renders_without_warnings(tmp_path: Path, name: str) -> None:
    if not Path("/usr/bin/man").exists():
        pytest.skip("man-db is not installed (make apt installs it)")
    page = tmp_path / name
    page.write_text(_manpage_module().render(name))
    shown = man(page)
    # The NAME line, as justified: groff 1.23 (Debian 13) may widen its spaces.
    assert re.search(rf"^ +{re.escape(name.rsplit('.', 1)[0])} +- ", shown, re.M)


def test_manpage_script_takes_the_page_to_write() -> None:
    script = [sys.executable, str(PACKAGING / "manpage.py")]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = run([*script, "exitwatch.toml.5"], env=env)
    assert done.stdout.startswith(".TH EXITWATCH.TOML 5 ")
    bad = run([*script, "exitwatch.1"], env=env, check=False)
    assert (bad.returncode, bad.stdout) == (2, "")
    assert bad.stderr.strip().splitlines() == [
        "usage: manpage.py PAGE, one of exitwatch.8, exitwatch.toml.5, exitwatch-run.1"
    ]


def _plain(roff: str) -> str:
    """Roff text without its font changes and escapes."""
    return re.sub(r"\\f[BIR]", "", roff).replace("\\-", "-").replace("\\e", "\\")


def _setting(page: str, key: str) -> str:
    """The paragraph of exitwatch.toml(5) about `key`: its tag line to the next one."""
    return page.split(f"\n.TP\n\\fB{key}\\fR ", 1)[1].split("\n.TP\n", 1)[0].split("\n.SH")[0]


def _sections() -> list[tuple[str | None, type]]:
    """The file's parts: the top level (None), each kind's table, then [adopt]."""
    kinds = [(reg.table, reg.settings) for reg in registry.KINDS]
    return [(None, Config), *kinds, (TABLE, Adopt)]


def _part(page: str, table: str | None) -> str:
    """The page's paragraphs of one part of the file: the top level's, or one table's."""
    if table is None:
        return page.split('\n.SS "[', 1)[0]
    return page.split(f'.SS "[{table}]"', 1)[1].split("\n.SS ", 1)[0].split("\n.SH ", 1)[0]


def _load_one(tmp_path: Path, table: str | None, key: str, written: str) -> object:
    """The value a file of that one setting gives it."""
    path = tmp_path / f"{table}-{key}.toml"
    path.write_text(f"{key} = {written}\n" if table is None else f"[{table}]\n{key} = {written}\n")
    config = config_module.load(str(path))
    if table is None:
        return getattr(config, key)
    return getattr(config.adopt if table == TABLE else config.kind(table), key)


def test_config_page_gives_every_setting_its_default_docstring_and_values(tmp_path) -> None:
    manpage = _manpage_module()
    page = manpage.render("exitwatch.toml.5")
    for table, of in _sections():
        part, docs = _part(page, table), manpage.field_docs(of)
        for field in fields(of):
            assert field.name in docs, f"{of.__name__}.{field.name} has no docstring after it"
            if table is None and field.name in (TABLE, "kinds"):
                continue  # their keys are in sections of their own, below
            about = _setting(part, field.name)
            said = " ".join(docs[field.name].replace("`", "").split())
            assert said in " ".join(_plain(about).split()), (table, field.name)
            assert "\nTakes " in about, (table, field.name)
            assert ("(exitwatch adopt)" in about) == (table == TABLE), (table, field.name)
            if field.default is None:
                assert about.startswith("(unset)"), (table, field.name)
                continue
            # The default as the page writes it is what the file means by it.
            written = _plain(about.split("\n", 1)[0]).removeprefix("= ")
            assert _load_one(tmp_path, table, field.name, written) == field.default, written
    assert "Takes a number in 0.01..3600." in _setting(_part(page, None), "poll_interval")
    roots = _setting(_part(page, "workdirs"), "roots")
    assert "\\-\\-workdir\\-root (exitwatch agent, exitwatch reap)" in roots
    assert "workdir_roots (roots)" in _plain(_part(page, "workdirs"))
    example = tmp_path / "example.toml"
    example.write_text(manpage.CONFIG_EXAMPLE)
    config_module.load(str(example))


def test_run_page_lists_the_run_options_and_exit_statuses() -> None:
    from exitwatch.run.supervise import SETUP_FAILED

    page = _manpage_module().render("exitwatch-run.1")
    run_cmd = cli.commands["run"]
    for param in run_cmd.params:
        if isinstance(param, click.Option):
            for opt in param.opts:
                assert opt.replace("-", "\\-") in page, opt
    statuses = page.split(".SH EXIT STATUS", 1)[1].split(".SH", 1)[0]
    for code in (2, SETUP_FAILED, 126, 127):
        assert f".B {code}\n" in statuses, code


def _documented() -> dict[str | None, dict[str, object]]:
    """The conffile's example settings, every `#key = value` line uncommented, by the part
    of the file they are in: the top level (None), or the table of the `#[name]` line
    above them."""
    parts = re.split(r"^#\[(\w+)\]$", (PACKAGING / "config.toml").read_text(), flags=re.M)
    tables = [None, *parts[1::2]]
    return {
        table: tomllib.loads("\n".join(re.findall(r"^#(\w+ = .*)$", text, flags=re.M)))
        for table, text in zip(tables, parts[::2], strict=True)
    }


def test_conffile_documents_every_setting_with_its_default(tmp_path: Path) -> None:
    documented = _documented()
    assert list(documented) == [table for table, _ in _sections()]
    for table, of in _sections():
        given = documented[table]
        names = {f.name: f.default for f in fields(of) if f.name not in (TABLE, "kinds")}
        assert set(names) <= set(given), f"undocumented in {table}: {set(names) - set(given)}"
        assert set(given) <= set(names), f"unknown in {table}: {set(given) - set(names)}"
        for key, default in names.items():
            if default is not None and default != ():  # unset or empty: an example value
                value = given[key]
                assert (tuple(value) if isinstance(value, list) else value) == default, key
    # And the examples are valid settings, so uncommenting one never stops the agent.
    path = tmp_path / "config.toml"
    path.write_text(
        "\n".join(
            line[1:]
            for line in (PACKAGING / "config.toml").read_text().splitlines()
            if re.match(r"#(\w+) = |#\[", line)
        )
    )
    config_module.load(str(path))
