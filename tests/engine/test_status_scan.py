"""`exitwatch status` with no agent: its one-shot scan stays readable on a host full of bad
markers. They are summarized in the status; `exitwatch reap --dry-run` names each."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from exitwatch import mark_workdir
from exitwatch.contract import MARKER

from support.agentproc import NO_LEFTOVERS
from support.procs import kill, spawn_owner

BAD = 11


def _exitwatch(*args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "exitwatch", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def test_bad_markers_are_summarized_not_warned_one_by_one(engine, workroot: Path, tmp_path):
    for i in range(BAD):
        bad = workroot / f"bad{i}"
        bad.mkdir()
        (bad / MARKER).write_text("not json")
    alive = spawn_owner()
    good = workroot / "good"
    good.mkdir()
    mark_workdir(good, alive.pid)
    config = tmp_path / "config.toml"
    config.write_text(
        f'{NO_LEFTOVERS}workdir_roots = ["{workroot}"]\ndocker_host = "{engine.host}"\n'
        f'audit_log = "{tmp_path / "audit.jsonl"}"\n'
    )
    common = ("--config", str(config), "--status-socket", str(tmp_path / "none.sock"))
    try:
        done = _exitwatch("status", *common)
        assert done.returncode == 3, done.stderr
        assert "WARNING" not in done.stderr and MARKER not in done.stderr, done.stderr
        assert f"{BAD} markers skipped; `exitwatch reap --dry-run` lists them" in done.stdout
        assert str(good) in done.stdout  # the rest of the status is intact

        doc = json.loads(_exitwatch("status", *common, "--json").stdout)
        assert doc["skipped_markers"] == BAD

        listed = _exitwatch("reap", "--config", str(config), "--dry-run")
        assert listed.returncode == 0, listed.stderr
        for i in range(BAD):
            assert f"marker {workroot / f'bad{i}' / MARKER} is not JSON" in listed.stderr
    finally:
        kill(alive)


def test_a_kind_that_cannot_be_listed_is_one_line_in_status_and_fails_reap(
    engine, workroot: Path, tmp_path
):
    """As a hook spool a user who is not root cannot list: status says so in one line;
    `exitwatch reap` reaps the other kinds and exits non-zero naming it."""
    spool = tmp_path / "spool"
    spool.mkdir()
    spool.chmod(0o777)  # not sticky: refused, and a refused spool cannot be listed
    dead = spawn_owner()
    orphan = workroot / "orphan"
    orphan.mkdir()
    mark_workdir(orphan, dead.pid)
    kill(dead)
    config = tmp_path / "config.toml"
    config.write_text(
        f'{NO_LEFTOVERS}workdir_roots = ["{workroot}"]\ndocker_host = "{engine.host}"\n'
        f'audit_log = "{tmp_path / "audit.jsonl"}"\n'
    )
    common = ("--config", str(config), "--hook-dir", str(spool))

    done = _exitwatch("status", *common, "--status-socket", str(tmp_path / "none.sock"))
    assert done.returncode == 3, done.stderr
    assert done.stderr == ""
    [line] = [x for x in done.stdout.splitlines() if "not listed" in x]
    assert f"hooks: hook spool {spool}" in line and "not sticky" in line
    assert str(orphan) in done.stdout  # the other kinds are listed all the same

    reaped = _exitwatch("reap", *common)
    assert reaped.returncode == 1
    assert reaped.stderr.splitlines()[-1].startswith("Error: could not list the hooks: hook spool")
    assert not orphan.exists()
