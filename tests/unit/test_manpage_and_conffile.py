"""The man pages and the conffile kept in step with the code: exitwatch(8) names every
command and option, exitwatch.toml(5) every setting with its default and its docstring,
exitwatch-run(1) the run's options and exit statuses; each renders without warnings, and
packaging/config.toml documents every setting with its default. system/test_deb.py builds
and installs the package."""

from __future__ import annotations

import importlib
import inspect
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
from exitwatch.contract import ENV_HOOK_DIR, ENV_OWNER, ENV_RUN
from exitwatch.kinds import registry
from exitwatch.service import config as config_module
from exitwatch.service.config import TABLE, Adopt, Config
from exitwatch.sources.netlink import RCVBUF_ENV

from support.packaging import PACKAGING, PAGES, man
from support.procs import run

ROOT = PACKAGING.parent


def _manpage_module(name: str = "manpage"):
    # As debian/rules runs it: a script beside mansource.py and the pages' modules.
    sys.path.insert(0, str(PACKAGING))
    try:
        return importlib.import_module(name)
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


def _shown_paragraph(shown: str, start: str) -> str:
    """The paragraph of the rendered page `shown` whose first line begins with `start`, its
    words joined by single spaces; it must be filled as one, every line at one indent."""
    lines = shown.splitlines()
    first = next(i for i, line in enumerate(lines) if " ".join(line.split()).startswith(start))
    para = []
    for line in lines[first:]:
        if not line.strip():
            break
        para.append(line)
    indents = {len(line) - len(line.lstrip()) for line in para}
    assert len(indents) == 1, "broken mid-paragraph:\n" + "\n".join(para)
    return " ".join(" ".join(para).split())


def test_man_page_fills_each_command_description_as_its_help_does(tmp_path: Path) -> None:
    """Each paragraph of a command's help comes out whole, dedented as `--help` dedents it;
    a paragraph kept as written (click's \\b) keeps its lines."""
    if not Path("/usr/bin/man").exists():
        pytest.skip("man-db is not installed (make apt installs it)")
    page = tmp_path / "exitwatch.8"
    page.write_text(_manpage_module().render("exitwatch.8"))
    shown = man(page)
    for name in ("agent", "adopt", "on-death"):
        for para in inspect.cleandoc(cli.commands[name].help or "").split("\n\n"):
            if para.startswith("\b\n"):
                for line in para.splitlines()[1:]:
                    assert re.search(rf"^ +{re.escape(line.strip())}$", shown, re.M), line
                continue
            words = " ".join(para.split()).replace("`", "")
            assert _shown_paragraph(shown, " ".join(words.split()[:6])) == words, name
    agent = "SIGTERM or SIGINT stops it within 2 s; SIGHUP re-reads the config file."
    assert _shown_paragraph(shown, "SIGTERM or SIGINT stops it within") == agent


def test_manpage_script_takes_the_page_to_write() -> None:
    script = [sys.executable, str(PACKAGING / "manpage.py")]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = run([*script, "exitwatch.toml.5"], env=env)
    assert done.stdout.startswith(".TH EXITWATCH.TOML 5 ")
    bad = run([*script, "exitwatch.1"], env=env, check=False)
    assert (bad.returncode, bad.stdout) == (2, "")
    assert bad.stderr.strip().splitlines() == [
        "usage: manpage.py PAGE, one of exitwatch.8, exitwatch.toml.5, exitwatch-run.1, "
        "exitwatch-adopt.8, exitwatch-files.5"
    ]


def test_pages_stand_alone_and_point_at_each_other() -> None:
    """The .deb installs no docs/: no page points there; each names the others it needs
    in SEE ALSO, exitwatch(8) all of them."""
    manpage = _manpage_module()
    named = {name: name.rsplit(".", 1)[0] + "(" + name.rsplit(".", 1)[1] + ")" for name in PAGES}
    for name in PAGES:
        page = _plain(manpage.render(name))
        assert "docs/" not in page and ".md" not in page, name
        see_also = page.split(".SH SEE ALSO\n", 1)[1]
        for other in PAGES:
            if other != name and (name == "exitwatch.8" or other == "exitwatch.8"):
                assert named[other] in see_also, f"{name} does not name {other}"
    assert "exitwatch-adopt(8)" in _plain(manpage.render("exitwatch.toml.5"))


def test_exitwatch_8_has_exit_status_environment_and_examples() -> None:
    from exitwatch.alive import ENV_LEASE_DIR, ENV_LEASE_OWNER, ENV_WATCHDOG_DIR
    from exitwatch.cli import NO_AGENT

    page = _manpage_module().render("exitwatch.8")
    sections = re.findall(r"^\.SH (.*)$", page, flags=re.M)
    for wanted in ("EXIT STATUS", "ENVIRONMENT", "FILES", "EXAMPLES", "SEE ALSO"):
        assert wanted in sections, wanted
    statuses = page.split(".SH EXIT STATUS", 1)[1].split(".SH", 1)[0]
    for code in (0, 1, 2, NO_AGENT):
        assert f".B {code}\n" in statuses, code
    environment = _plain(page.split(".SH ENVIRONMENT", 1)[1].split(".SH", 1)[0])
    for name in (
        "DOCKER_HOST",
        ENV_HOOK_DIR,
        ENV_LEASE_DIR,
        ENV_WATCHDOG_DIR,
        ENV_LEASE_OWNER,
        ENV_OWNER,
        ENV_RUN,
        RCVBUF_ENV,
        "NOTIFY_SOCKET",
    ):
        assert name in environment, name
    examples = _plain(page.split(".SH EXAMPLES", 1)[1].split(".SH", 1)[0])
    for command in (
        "exitwatch labels",
        "exitwatch mark",
        "exitwatch on-death",
        "exitwatch while-alive",
        "exitwatch watchdog",
        "exitwatch reap",
    ):
        assert command in examples, command


def test_adopt_page_has_its_options_and_sections() -> None:
    page = _manpage_module().render("exitwatch-adopt.8")
    for param in cli.commands["adopt"].params:
        if isinstance(param, click.Option):
            for opt in param.opts:
                assert opt.replace("-", "\\-") in page, opt
    sections = re.findall(r"^\.SH (.*)$", page, flags=re.M)
    for wanted in ("OPTIONS", "OWNERS", "EXIT STATUS", "ENVIRONMENT", "EXAMPLES", "SEE ALSO"):
        assert wanted in sections, wanted
    # Its own help's pointer to this very page is left out.
    assert "exitwatch\\-adopt(8) has the recipes" not in page


def test_files_page_gives_the_formats_the_code_reads() -> None:
    """The hook, lease and watchdog keys are exactly those their files may have, the audit
    fields those the agent writes, the status keys those the document has, and its
    examples parse."""
    import json
    from dataclasses import fields as dc_fields

    from exitwatch.agent.record import Reap
    from exitwatch.alive import lease_problem, watchdog_problem
    from exitwatch.contract import hook_problem
    from exitwatch.owner import Owner

    manfiles = _manpage_module("manfiles")
    page = _plain(_manpage_module().render("exitwatch-files.5"))
    body = {"owner": "x", "argv": ["true"], "cwd": "", "env": {}, "timeout": 1, "created": 0}
    assert hook_problem(body) is None
    assert set(manfiles.HOOK_KEYS) == set(body)
    lease = body | {"every": 60}
    assert lease_problem(lease) is None
    assert set(manfiles.LEASE_KEYS) == set(lease) - set(body)
    dog = {"owner": "x", "timeout": 60, "grace": 1, "created": 0, "reason": ""}
    assert watchdog_problem(dog) is None
    assert set(manfiles.WATCHDOG_KEYS) == set(dog)
    for key in dog:  # each but reason is required, and no other key is taken
        want = None if key == "reason" else f"it lacks {key}"
        assert watchdog_problem({k: v for k, v in dog.items() if k != key}) == want, key
    assert watchdog_problem(dog | {"pets": 1}) is not None
    assert set(manfiles.REAP_FIELDS) == {f.name for f in dc_fields(Reap)}
    keys = (*manfiles.HOOK_KEYS, *manfiles.LEASE_KEYS, *manfiles.WATCHDOG_KEYS)
    for key in (*keys, *manfiles.REAP_FIELDS, *manfiles.STATUS_KEYS):
        assert f"\n.B {key}\n" in page, key
    checks = {"marker": 0, "hook": 0, "lease": 0, "watchdog": 0}
    for example in re.findall(r"^\.EX\n(\{.*?)\n\.EE$", page, flags=re.M | re.S):
        parsed = json.loads(example)
        Owner.parse(parsed["owner"])
        if "every" in parsed:
            assert lease_problem(parsed) is None
            checks["lease"] += 1
        elif "argv" in parsed:
            assert hook_problem(parsed) is None
            checks["hook"] += 1
        elif "grace" in parsed:
            assert watchdog_problem(parsed) is None
            checks["watchdog"] += 1
        else:
            checks["marker"] += 1
    assert checks == {"marker": 1, "hook": 1, "lease": 1, "watchdog": 1}


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
        part, docs = _part(page, table), _manpage_module("mansource").field_docs(of)
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
    example.write_text(_manpage_module("mantoml").CONFIG_EXAMPLE)
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
    for section in ("ENVIRONMENT", "TIMEOUTS", "EXAMPLES"):
        assert f"\n.SH {section}\n" in page, section
    assert "EXITWATCH_WATCHDOG_DIR" in page


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
