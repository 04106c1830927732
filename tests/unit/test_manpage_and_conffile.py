"""The man page and the conffile kept in step with the code: exitwatch(8) names every
command and option and renders without warnings, and packaging/config.toml documents
every setting with its default. system/test_deb.py builds and installs the package."""

from __future__ import annotations

import importlib.util
import re
import tomllib
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path

import click
import pytest

from exitwatch.cli import cli
from exitwatch.service import config as config_module
from exitwatch.service.config import Config

from support.packaging import DEBIAN_ENV, PACKAGING
from support.procs import run


def _manpage_module():
    spec = importlib.util.spec_from_file_location("manpage", PACKAGING / "manpage.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _commands(group: click.Group, path: str) -> Iterator[tuple[str, click.Command]]:
    for name, cmd in sorted(group.commands.items()):
        if cmd.hidden:
            continue
        yield f"{path} {name}", cmd
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, f"{path} {name}")


def test_man_page_lists_every_command_and_option() -> None:
    page = _manpage_module().render()
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


def test_man_page_renders_without_warnings(tmp_path: Path) -> None:
    if not Path("/usr/bin/man").exists():
        pytest.skip("man-db is not installed")
    page = tmp_path / "exitwatch.8"
    page.write_text(_manpage_module().render())
    done = run(["man", "--warnings", "-l", str(page)], env=DEBIAN_ENV | {"MANPAGER": "cat"})
    assert done.stderr == ""
    assert "exitwatch agent" in done.stdout


def _documented() -> dict[str, object]:
    """The conffile's example settings: every `#key = value` line, uncommented."""
    text = (PACKAGING / "config.toml").read_text()
    lines = re.findall(r"^#(\w+ = .*)$", text, flags=re.M)
    return tomllib.loads("\n".join(lines))


def test_conffile_documents_every_setting_with_its_default(tmp_path: Path) -> None:
    documented = _documented()
    known = {f.name: f.default for f in fields(Config)}
    assert set(known) <= set(documented), f"undocumented: {set(known) - set(documented)}"
    assert set(documented) <= set(known), f"unknown: {set(documented) - set(known)}"
    for key, default in known.items():
        if default is not None:  # unset by default: the file shows an example value
            value = documented[key]
            assert (tuple(value) if isinstance(value, list) else value) == default, key
    # And the examples are valid settings, so uncommenting one never stops the agent.
    path = tmp_path / "config.toml"
    path.write_text(
        "\n".join(
            line[1:]
            for line in (PACKAGING / "config.toml").read_text().splitlines()
            if re.match(r"#(\w+) = ", line) and line[1:].split(" ", 1)[0] in known
        )
    )
    config_module.load(str(path))
