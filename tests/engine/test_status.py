"""`exitwatch status`: the text view, `--since` over the audit log and its rotation, and a
document too large for the socket's buffer sent to a client that never reads. Real agent
processes against the real engine and kernel."""

from __future__ import annotations

import json
import select
import shutil
import socket
import subprocess
import tempfile
import time
from datetime import datetime
from pathlib import Path

import pytest

from exitwatch import mark_workdir
from exitwatch.service.status.server import query

from support.agentproc import NO_LEFTOVERS, Agents, agent_argv, container, wait_gone
from support.cli import EXITWATCH, status
from support.procs import kill, spawn_owner, wait_for


@pytest.fixture
def root():
    path = Path(tempfile.mkdtemp(prefix="exitwatch-st-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def run_agent(engine, root, tmp_path):
    agents = Agents(engine.host, root, tmp_path)
    yield agents.start
    agents.stop()


# -- --since over the audit log -------------------------------------------------------------


def _entry(at: float, what: str) -> dict:
    return {
        "time": at,
        "what": what,
        "kind": "workdir",
        "owner": "00000000-0000-0000-0000-000000000000:1:1",
        "death": "process gone",
        "latency_ms": 1.0,
        "result": "removed",
        "ok": True,
        "refused": False,
        "dry_run": False,
    }


def test_since_reads_both_files_of_a_rotated_audit_log_and_keeps_the_window(
    engine, run_agent, root, tmp_path
):
    argv = agent_argv("netlink", engine.host, root)
    audit = Path(argv[argv.index("--audit-log") + 1])
    now = time.time()
    # Earlier runs' entries, old and recent, filling the file up to the rotation size: the
    # agent's first entry rotates it to .1 for real.
    recent = [f"workdir /recent/{i}" for i in range(6)]
    old: list[str] = []

    def lines() -> str:
        seeded = [_entry(now - 3 * 3600, w) for w in old] + [_entry(now - 1800, w) for w in recent]
        return "".join(json.dumps(e, separators=(",", ":")) + "\n" for e in seeded)

    while len(lines()) < 3900:
        old.append(f"workdir /old/{len(old)}")
    text = lines()
    assert len(text) < 4096
    audit.write_text(text)
    config = tmp_path / "config.toml"
    config.write_text(NO_LEFTOVERS + "audit_max_bytes = 4096\n")
    agent = run_agent(argv=[*argv, "--config", str(config)])

    owner = spawn_owner()
    cid = container(engine, owner.pid)
    kill(owner)
    wait_gone(engine, [cid])
    wait_for(lambda: len(agent.status()["reaps"]) == 1, what="the removal recorded")
    # The status has the removal before the file does; the seeded file is there all along.
    wait_for(
        lambda: f"container {cid[:12]}" in (audit.read_text() if audit.exists() else ""),
        what="the audit entry written",
    )
    rotated = Path(f"{audit}.1")
    assert rotated.read_text() == text  # the seeded file was rotated, whole
    sock = agent.flag("--status-socket")

    def whats(*since: str) -> list[str]:
        done = status(sock, "--json", *since)
        assert done.returncode == 0, done.stderr
        return [r["what"] for r in json.loads(done.stdout)["reaps"]]

    mine = f"container {cid[:12]}"
    assert [w.split(" (")[0] for w in whats()] == [mine]  # the agent's memory: this run only
    assert [w.split(" (")[0] for w in whats("--since", "1h")] == [*recent, mine]
    assert [w.split(" (")[0] for w in whats("--since", "90m")] == [*recent, mine]
    assert [w.split(" (")[0] for w in whats("--since", "4h")] == [*old, *recent, mine]
    two_hours_ago = datetime.fromtimestamp(now - 7200).isoformat(timespec="seconds")
    assert [w.split(" (")[0] for w in whats("--since", two_hours_ago)] == [*recent, mine]
    assert [w.split(" (")[0] for w in whats("--since", "10m")] == [mine]
    # The text view lists the same window.
    text_view = status(sock, "--since", "1h").stdout
    assert "recent removals: 7" in text_view
    assert "workdir /old/" not in text_view
    assert "workdir /recent/5" in text_view


# -- the text view --------------------------------------------------------------------------


def test_text_status_of_a_running_agent_shows_owners_and_counters(engine, run_agent, root):
    agent = run_agent()
    owner, doomed = spawn_owner(), spawn_owner()
    cid = container(engine, owner.pid)
    path = root / "held"
    path.mkdir()
    mark_workdir(path, owner.pid)
    gone = container(engine, doomed.pid)
    agent.wait_holding(owner.pid, containers=1, workdirs=1)
    agent.wait_holding(doomed.pid, containers=1)
    kill(doomed)
    wait_gone(engine, [gone])
    wait_for(lambda: len(agent.status()["reaps"]) == 1, what="the removal recorded")
    name = engine.client.api.inspect_container(cid)["Name"].lstrip("/")

    done = status(agent.flag("--status-socket"))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("exitwatch ") and f"(pid {agent.pid})" in lines[0]
    [counters] = [x for x in lines if x.startswith("  counters: ")]
    assert "reaped container 1" in counters
    assert "exit hints " in counters and "events lost " in counters
    at = lines.index("owners watched: 1")
    assert lines[at + 1 : at + 4] == [
        f"  {owner.owner} (pid {owner.pid})",
        f"    container {cid[:12]} ({name})",
        f"    workdir {path}",
    ]
    assert "orphans pending: 0" in lines
    assert any(f"removed: container {gone[:12]}" in x for x in lines)
    kill(owner)


def test_text_status_with_no_agent_shows_the_scan(engine, root, tmp_path):
    alive, dead = spawn_owner(), spawn_owner()
    kept = root / "alive"
    kept.mkdir()
    mark_workdir(kept, alive.pid)
    orphan = root / "orphan"
    orphan.mkdir()
    mark_workdir(orphan, dead.pid)
    cid = container(engine, dead.pid)
    name = engine.client.api.inspect_container(cid)["Name"].lstrip("/")
    kill(dead)
    config = tmp_path / "config.toml"
    config.write_text(f'{NO_LEFTOVERS}workdir_roots = ["{root}"]\ndocker_host = "{engine.host}"\n')
    done = subprocess.run(
        [*EXITWATCH, "status", "--config", str(config), "--status-socket", f"{root}/none.sock"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 3, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == (
        "no agent answers: a one-shot scan shows what it would find (nothing removed)"
    )
    assert f"  docker:   {engine.host}: connected" in lines
    assert not any(x.startswith("  counters: ") for x in lines)
    at = lines.index("owners watched: 1")
    assert lines[at + 1 : at + 3] == [f"  {alive.owner} (pid {alive.pid})", f"    workdir {kept}"]
    at = lines.index("orphans pending: 1")
    assert lines[at + 1] == f"  {dead.owner} (process gone): {name}, {orphan}"
    assert "recent removals" not in done.stdout  # a scan has none to show
    assert orphan.exists()
    kill(alive)


# -- a client that never reads --------------------------------------------------------------

SEND_TIMEOUT = 1.0  # "drops a client that does not read within a second" (docs/operations.md)


def test_a_client_that_never_reads_a_large_status_is_dropped_and_status_still_answers(
    engine, run_agent, root
):
    owner = spawn_owner()
    # Thousands of workdirs with long names: a status document of megabytes, far more
    # than a unix socket holds unread.
    n = 5000
    for i in range(n):
        path = root / f"{i:05d}-{'w' * 230}"
        path.mkdir()
        mark_workdir(path, owner.pid)
    agent = run_agent()
    agent.wait_holding(owner.pid, workdirs=n)
    sock = agent.flag("--status-socket")
    asked = time.monotonic()
    full = len(json.dumps(query(sock, timeout=30)).encode())
    took = time.monotonic() - asked  # building and reading it whole
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        buffered = probe.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
    assert full > 2 * buffered, (full, buffered)

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as idle:
        idle.connect(sock)
        connected = time.monotonic()
        # The agent hangs up on it while its answer still sits unread in the buffer.
        poller = select.poll()
        poller.register(idle, select.POLLRDHUP)
        assert poller.poll(30_000), "the agent never dropped a client that does not read"
        waited = time.monotonic() - connected
        # Dropped a second after its answer was built (docs/operations.md), not sooner and
        # not much later: the building took at most about what the whole query above did.
        assert SEND_TIMEOUT * 0.9 <= waited <= SEND_TIMEOUT + 2 * took + 2, (waited, took)
        doc = query(sock, timeout=30)
        assert doc is not None, "status stopped answering after a client that never read"
        [mine] = [o for o in doc["owners"] if o["pid"] == owner.pid]
        assert len(mine["workdirs"]) == n
        got = b""
        while chunk := idle.recv(1 << 20):
            got += chunk
        assert 0 < len(got) < full  # cut short: the agent gave up on it
    kill(owner)
