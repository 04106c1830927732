"""On-death hooks end to end: a real agent, real owners killed with SIGKILL, a stand-in
sandbox service on 127.0.0.1 that the hooks call with curl, and a real unprivileged user."""

from __future__ import annotations

import contextlib
import grp
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from exitwatch import cancel_hook, mark_workdir, on_death
from exitwatch.contract import ENV_HOOK_DIR, HOOK_FILE

from support.agentproc import NO_LEFTOVERS, Agent, free_port, quiet_config, scrape
from support.procs import kill, spawn_owner, state, wait_for
from support.users import SYSTEM_PYTHON, as_user

REPO = Path(__file__).resolve().parents[2]
DEADLINE = 30.0  # for a correct agent on a loaded machine; bench/hooks.py measures speed


class Sandboxes:
    """A stand-in for a provider's sandbox API: it records each DELETE /sandboxes/NAME."""

    def __init__(self) -> None:
        self.deleted: dict[str, float] = {}  # name -> monotonic time of its DELETE
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_DELETE(self) -> None:
                outer.deleted[self.path.rsplit("/", 1)[-1]] = time.monotonic()
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/sandboxes"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def delete_argv(self, name: str) -> list[str]:
        return ["curl", "-fsS", "-X", "DELETE", f"{self.url}/{name}"]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def sandboxes() -> Iterator[Sandboxes]:
    service = Sandboxes()
    try:
        yield service
    finally:
        service.close()


@pytest.fixture
def hook_agent(start_agent, spool):
    """Start a real agent (as test_agent does) on the test's spool."""
    return lambda *extra: start_agent("netlink", "--hook-dir", str(spool), *extra)


def hooks_held(agent: Agent, pid: int) -> list[str]:
    mine = [o for o in agent.status()["owners"] if o["pid"] == pid]
    return mine[0].get("hooks", []) if mine else []


def test_a_sigkilled_owners_hook_deletes_its_sandbox(hook_agent, sandboxes, spool):
    agent = hook_agent()
    owner = spawn_owner()
    hook_id = on_death(sandboxes.delete_argv("sbx-1"), pid=owner.pid)
    assert (spool / hook_id / HOOK_FILE).stat().st_mode & 0o777 == 0o600
    wait_for(lambda: hooks_held(agent, owner.pid), DEADLINE, "the agent to hold the hook")
    killed = time.monotonic()
    kill(owner)
    wait_for(lambda: "sbx-1" in sandboxes.deleted, DEADLINE, "the DELETE of sbx-1")
    assert sandboxes.deleted["sbx-1"] > killed
    # Ran once, and its file is gone for good.
    wait_for(lambda: not (spool / hook_id).exists(), DEADLINE, "the hook gone")
    agent.wait_log(f"reaped hook {hook_id}")
    audit = Path(agent.flag("--audit-log"))
    entry = next(
        json.loads(line)
        for line in audit.read_text().splitlines()
        if hook_id in json.loads(line)["what"]
    )
    assert entry["extra"]["hook"]["argv0"] == "curl"
    assert entry["extra"]["hook"]["uid"] == 0
    assert entry["extra"]["hook"]["returncode"] == 0
    assert "SIGKILL" in entry["death"] or "gone" in entry["death"]


def test_live_and_cancelled_owners_hooks_never_fire(hook_agent, sandboxes, spool):
    agent = hook_agent()
    live, cancelled, dead = spawn_owner(), spawn_owner(), spawn_owner()
    on_death(sandboxes.delete_argv("live"), pid=live.pid)
    gone_id = on_death(sandboxes.delete_argv("cancelled"), pid=cancelled.pid)
    on_death(sandboxes.delete_argv("dead"), pid=dead.pid)
    wait_for(lambda: hooks_held(agent, cancelled.pid), DEADLINE, "the agent to hold the hook")
    assert cancel_hook(gone_id) is True
    assert cancel_hook(gone_id) is False  # cancelled already
    kill(cancelled)
    kill(dead)
    # The dead owner's hook ran after the cancelled one's owner died: the agent has seen
    # both deaths, and had a hook to run for one of them only.
    wait_for(lambda: "dead" in sandboxes.deleted, DEADLINE, "the dead owner's DELETE")
    agent.wait_log("reaped hook")
    assert set(sandboxes.deleted) == {"dead"}
    [held] = hooks_held(agent, live.pid)  # still waiting for its owner
    assert "curl -fsS -X DELETE" in held
    text = subprocess.run(
        [*agent.argv[:3], "status", "--status-socket", agent.flag("--status-socket")],
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout
    assert f"    hook {held}" in text
    kill(live)
    wait_for(lambda: "live" in sandboxes.deleted, DEADLINE, "the DELETE once it died")
    assert "cancelled" not in sandboxes.deleted


def test_a_hook_whose_owner_died_while_no_agent_ran_fires_at_the_next_start(hook_agent, sandboxes):
    first = hook_agent()
    owner = spawn_owner()
    on_death(sandboxes.delete_argv("while-down"), pid=owner.pid)
    wait_for(lambda: hooks_held(first, owner.pid), DEADLINE, "the agent to hold the hook")
    first.kill()
    kill(owner)
    assert sandboxes.deleted == {}
    hook_agent()
    wait_for(lambda: "while-down" in sandboxes.deleted, DEADLINE, "the DELETE at start")


def test_exitwatch_reap_runs_hooks(engine, sandboxes, spool, tmp_path):
    owner = spawn_owner()
    hook_id = on_death(sandboxes.delete_argv("by-reap"), pid=owner.pid)
    kill(owner)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "exitwatch",
            "reap",
            "--config",
            quiet_config(tmp_path),
            "--docker-host",
            engine.host,
            "--workdir-root",
            str(tmp_path),
            "--hook-dir",
            str(spool),
            "--audit-log",
            str(tmp_path / "audit.jsonl"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "by-reap" in sandboxes.deleted
    assert not (spool / hook_id).exists()


# Registers a hook as the unprivileged user, owned by this very process, which then execs
# sleep (same pid and start time, so the owner lives until it is killed).
_REGISTER = """
import os, sys
sys.path.insert(0, sys.argv[1])
from exitwatch import on_death
out, victim = sys.argv[2], sys.argv[3]
script = f'id > {out}/id; touch {victim}/pwned 2> {out}/err; echo $? > {out}/rc'
print(on_death(["sh", "-c", script]), flush=True)
os.execvp("sleep", ["sleep", "1000000"])
"""


def test_a_users_hook_runs_as_that_user_and_no_more(hook_agent, spool, attacker):
    out = Path(tempfile.mkdtemp(prefix="exitwatch-hook-out-"))
    victim = Path(tempfile.mkdtemp(prefix="exitwatch-victim-"))
    os.chmod(out, 0o1777)
    os.chmod(victim, 0o755)
    try:
        agent = hook_agent()
        proc = as_user(
            attacker,
            f'cd "$3" && exec {SYSTEM_PYTHON} -I -S -c "$1" "$2" "$3" "$4"',
            _REGISTER,
            str(REPO),
            str(out),
            str(victim),
            stdout=subprocess.PIPE,
            env={ENV_HOOK_DIR: str(spool), "PATH": "/usr/bin:/bin"},
        )
        assert proc.stdout is not None
        hook_id = proc.stdout.readline().decode().strip()
        hook = spool / hook_id
        assert hook.stat().st_uid == (hook / HOOK_FILE).stat().st_uid == attacker.pw_uid
        # Another user cannot take it away: the sticky bit, and cancel_hook's own check.
        with pytest.raises(PermissionError):
            cancel_hook(hook_id)
        roots = on_death(["true"], pid=os.getpid())
        meddle = as_user(attacker, 'ls "$1"; rm -rf "$1/$2"; mv "$1/$2" "$1/.x"', str(spool), roots)
        assert meddle.wait(timeout=30) != 0
        assert (spool / roots / HOOK_FILE).exists()
        assert cancel_hook(roots)
        wait_for(lambda: hooks_held(agent, proc.pid), DEADLINE, "the agent to hold the hook")
        proc.kill()
        proc.wait()
        wait_for(lambda: (out / "rc").exists(), DEADLINE, "the hook to run")
        groups = ",".join(
            f"{g}({_group_name(g)})" for g in os.getgrouplist(attacker.pw_name, attacker.pw_gid)
        )
        name = attacker.pw_name
        assert (out / "id").read_text() == (
            f"uid={attacker.pw_uid}({name}) gid={attacker.pw_gid}({_group_name(attacker.pw_gid)})"
            f" groups={groups}\n"
        )
        assert (out / "id").stat().st_uid == attacker.pw_uid
        assert (out / "rc").read_text().strip() != "0"
        assert "Permission denied" in (out / "err").read_text()
        assert not (victim / "pwned").exists()
    finally:
        shutil.rmtree(out)
        shutil.rmtree(victim)


def _group_name(gid: int) -> str:
    return grp.getgrgid(gid).gr_name


def test_a_hung_hook_holds_up_no_other_owners_removal(hook_agent, workroot, tmp_path):
    """With a single removal worker, an owner's hook that hangs does not keep another dead
    owner's workdir: hooks run on workers of their own."""
    config = tmp_path / "config.toml"
    config.write_text(NO_LEFTOVERS + "reap_workers = 1\n")
    port = free_port()
    agent = hook_agent("--config", str(config), "--metrics-addr", f"127.0.0.1:{port}")
    started = tmp_path / "hook-pid"
    hung, other = spawn_owner(), spawn_owner()
    script = f"echo $$ > {started}.tmp; mv {started}.tmp {started}; exec sleep 300"
    on_death(["sh", "-c", script], pid=hung.pid, timeout=600)
    workdir = workroot / "run"
    workdir.mkdir()
    mark_workdir(workdir, other.pid)
    wait_for(lambda: hooks_held(agent, hung.pid), DEADLINE, "the agent to hold the hook")
    agent.wait_holding(other.pid, workdirs=1)
    kill(hung)
    try:
        wait_for(started.exists, DEADLINE, "the hook to start")
        kill(other)
        wait_for(lambda: not workdir.exists(), DEADLINE, "the workdir removed beside the hook")
        assert state(int(started.read_text())) not in (None, "Z")  # still hanging

        # A hook may run for an hour: it is pending, but the pending-too-long alert's gauge
        # does not age with it. (The workdir's job is done a moment after the directory is
        # gone: until then two are pending.)
        def hook_alone_pending() -> list[str]:
            lines = scrape(port).splitlines()
            return lines if "exitwatch_removals_pending 1.0" in lines else []

        lines = wait_for(hook_alone_pending, DEADLINE, "the hook alone pending")
        assert "exitwatch_oldest_pending_removal_seconds 0.0" in lines
    finally:
        with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError):
            os.kill(int(started.read_text()), signal.SIGKILL)


def test_a_failing_hook_is_tried_the_set_times_then_shown_as_given_up(hook_agent, spool, tmp_path):
    config = tmp_path / "config.toml"
    config.write_text(NO_LEFTOVERS + "reap_attempts = 2\n")
    port = free_port()
    agent = hook_agent("--config", str(config), "--metrics-addr", f"127.0.0.1:{port}")
    count = tmp_path / "count"
    owner = spawn_owner()
    hook_id = on_death(["sh", "-c", f"echo try >> {count}; echo broke; exit 3"], pid=owner.pid)
    wait_for(lambda: hooks_held(agent, owner.pid), DEADLINE, "the agent to hold the hook")
    kill(owner)

    def given_up() -> list[dict]:
        return [p for p in agent.status()["pending"] if p.get("state") == "given up"]

    [item] = wait_for(given_up, DEADLINE, "the hook to be given up")
    assert item["kind"] == "hook"
    assert item["attempt"] == 2
    assert any(hook_id in what for what in item["what"])
    assert count.read_text() == "try\ntry\n"
    assert (spool / hook_id / HOOK_FILE).exists()  # kept
    counters = agent.status()["counters"]
    assert (counters["hook_runs"], counters["hook_failures"], counters["gave_up"]) == (2, 2, 1)
    text = subprocess.run(
        [*agent.argv[:3], "status", "--status-socket", agent.flag("--status-socket")],
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout
    assert "[attempt 2, given up]" in text and hook_id in text
    assert "exited with code 3" in agent.text() and "broke" in agent.text()
    metrics = scrape(port)
    for line in (
        "exitwatch_hook_runs_total 2.0",
        "exitwatch_hook_failures_total 2.0",
        "exitwatch_hook_timeouts_total 0.0",
        "exitwatch_removals_given_up_total 1.0",
    ):
        assert line in metrics, line


def test_exitwatch_reap_refuses_a_symlinked_spool_in_the_words_of_on_death(
    engine, spool, tmp_path, monkeypatch
):
    """The same rule on both sides: `exitwatch reap` exits 1 with the words that
    `exitwatch on-death` gives for the same spool, then what to do."""
    link = tmp_path / "link"
    link.symlink_to(spool)
    monkeypatch.setenv(ENV_HOOK_DIR, str(link))
    exitwatch = [sys.executable, "-m", "exitwatch"]
    registered = subprocess.run(
        [*exitwatch, "on-death", "--", "true"], capture_output=True, text=True, timeout=60
    )
    [why] = registered.stderr.splitlines()
    assert registered.returncode == 1 and "it is a symlink" in why
    flags = ["--config", quiet_config(tmp_path), "--docker-host", engine.host]
    flags += ["--workdir-root", str(tmp_path), "--hook-dir", str(link)]
    reaped = subprocess.run(
        [*exitwatch, "reap", *flags],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert reaped.returncode == 1
    # The rule in the same words; what to do after it is each command's own.
    rule = why.split(": it must be a directory of root's")[0]
    assert reaped.stderr.splitlines()[-1] == (
        rule.replace("Error: ", "Error: could not list the hooks: ")
        + "; the rest was reaped: fix that and run exitwatch reap again"
    )
    assert os.listdir(spool) == []
