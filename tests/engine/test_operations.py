"""Operating the agent: status, config file, audit log, metrics, signals, systemd
notifications, JSON logs. Real agent processes against the real engine and kernel."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

from exitwatch import mark_workdir

from support.agentproc import (
    NO_LEFTOVERS,
    Agent,
    Agents,
    container,
    exists,
    free_port,
    scrape,
    wait_gone,
)
from support.cli import exitwatch
from support.procs import kill, spawn_owner, wait_for


@pytest.fixture
def root():
    path = Path(tempfile.mkdtemp(prefix="exitwatch-ops-"))
    (path / "work").mkdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def run_agent(engine, root, tmp_path):
    agents = Agents(engine.host, root / "work", tmp_path)
    yield agents.start
    agents.stop()


def status(agent: Agent, *args: str) -> subprocess.CompletedProcess[str]:
    return exitwatch("status", "--status-socket", agent.flag("--status-socket"), *args)


def workdir(root: Path, pid: int, name: str) -> Path:
    path = root / "work" / name
    path.mkdir()
    mark_workdir(path, pid)
    return path


def test_status_of_a_running_agent(engine, run_agent, root):
    agent = run_agent()
    owner = spawn_owner()
    cid = container(engine, owner.pid)
    path = workdir(root, owner.pid, "held")

    agent.wait_holding(owner.pid, containers=1, workdirs=1)
    doc = agent.status()
    assert {"schema", "agent", "docker", "owners", "pending", "reaps", "counters"} <= set(doc)
    assert doc["agent"]["source"] == "netlink"
    assert doc["agent"]["source_reason"].startswith("netlink: self-test passed")
    first = {"endpoint": engine.host, "connected": True, "reconnects": 0, "last_error": None}
    assert doc["docker"] == {
        **first,
        "engines": [{**first, "how": "configured", "resources": 1}],
    }
    [mine] = [o for o in doc["owners"] if o["pid"] == owner.pid]
    assert mine["owner"] == str(owner.owner)
    assert [c["id"] for c in mine["containers"]] == [cid]
    assert mine["workdirs"] == [str(path)]

    kill(owner)
    wait_gone(engine, [cid], [path])
    # Recorded just after the engine and the file system say they are gone.
    wait_for(lambda: len(agent.status()["reaps"]) == 2, what="both removals recorded")
    done = status(agent)
    assert done.returncode == 0
    assert "source:   netlink" in done.stdout
    assert f"removed: container {cid[:12]}" in done.stdout
    assert f"removed: workdir {path}" in done.stdout
    doc = json.loads(status(agent, "--json").stdout)
    assert doc["counters"]["reaped_container"] == 1
    assert doc["counters"]["reaped_workdir"] == 1
    assert doc["counters"]["exits_seen"] >= 1
    # The hint may be handled while the owner is still a zombie of this test process.
    assert all("killed by SIGKILL" in r["death"] for r in doc["reaps"]), doc["reaps"]


def test_status_with_no_agent_scans_read_only_and_exits_3(engine, root, tmp_path):
    owner = spawn_owner()
    cid = container(engine, owner.pid)
    path = workdir(root, owner.pid, "orphan")
    alive = spawn_owner()
    kept = workdir(root, alive.pid, "alive")
    kill(owner)
    config = tmp_path / "config.toml"
    config.write_text(
        f'{NO_LEFTOVERS}workdir_roots = ["{root / "work"}"]\ndocker_host = "{engine.host}"\n'
    )
    done = exitwatch(
        "status", "--config", str(config), "--status-socket", str(tmp_path / "none.sock"), "--json"
    )
    assert done.returncode == 3, done.stderr
    doc = json.loads(done.stdout)
    assert doc["agent"] is None
    # Runs of others on the host (`exitwatch run`) show as owners of processes only.
    assert [o["workdirs"] for o in doc["owners"] if o["workdirs"]] == [[str(kept)]]
    [orphan] = doc["pending"]
    assert orphan["owner"] == str(owner.owner)
    assert orphan["death"] == "process gone"
    assert str(path) in orphan["what"]
    assert exists(engine, cid) and path.exists()  # nothing removed
    kill(alive)


def test_flags_override_the_config_file(engine, run_agent, tmp_path):
    config = tmp_path / "config.toml"
    config.write_text(NO_LEFTOVERS + "poll_interval = 7.5\nreap_attempts = 5\ndry_run = true\n")
    agent = run_agent("--config", str(config), "--poll-interval", "0.3")
    settings = json.loads(status(agent, "--json").stdout)["agent"]["config"]
    assert settings["poll_interval"] == 0.3  # the flag
    assert settings["reap_attempts"] == 5  # the file
    assert settings["dry_run"] is True


def test_audit_log_records_removals_and_refusals(engine, run_agent, root):
    agent = run_agent()
    audit = Path(agent.flag("--audit-log"))
    owner = spawn_owner()
    cid = container(engine, owner.pid)
    path = workdir(root, owner.pid, "removed")
    # A marker owned by another user than its directory's: never acted on.
    foreign = workdir(root, owner.pid, "foreign")
    os.chown(foreign / ".exitwatch-owner", 65534, 65534)

    # Seen before its death, the owner's death is told by the exit event, with its signal.
    agent.wait_holding(owner.pid, containers=1, workdirs=2)
    kill(owner)
    wait_gone(engine, [cid], [path])

    def entries() -> list[dict]:
        if not audit.exists():
            return []
        return [json.loads(line) for line in audit.read_text().splitlines()]

    wait_for(lambda: len(entries()) >= 3, what="three audit entries")
    by_what = {e["what"]: e for e in entries()}
    removed = by_what[f"workdir {path}"]
    assert removed["ok"] and not removed["refused"] and removed["result"] == "removed"
    assert removed["owner"] == str(owner.owner)
    assert "killed by SIGKILL" in removed["death"]
    assert removed["latency_ms"] >= 0
    [container_entry] = [e for e in entries() if e["kind"] == "container"]
    assert container_entry["ok"] and cid[:12] in container_entry["what"]
    refused = by_what[f"workdir {foreign}"]
    assert refused["refused"] and not refused["ok"]
    assert "uid" in refused["result"]
    assert foreign.exists()
    since = status(agent, "--since", "1h", "--json")
    assert len(json.loads(since.stdout)["reaps"]) == len(entries())


def test_metrics_after_a_reap(engine, run_agent, root):
    port = free_port()
    run_agent("--metrics-addr", f"127.0.0.1:{port}")
    owner = spawn_owner()
    cid = container(engine, owner.pid)
    kill(owner)
    wait_gone(engine, [cid])

    def reaped() -> str | None:
        text = scrape(port)
        return text if 'exitwatch_reaped_total{kind="container"} 1.0' in text else None

    text = wait_for(reaped, what="the reap in the metrics")
    assert 'exitwatch_reap_latency_seconds_count{kind="container"} 1.0' in text
    for name in (
        "exits_seen_total",
        "events_lost_total",
        "resyncs_total",
        "removal_errors_total",
        "engine_reconnects_total",
        "owners_watched",
        "resources_watched",
        f'engine_connected{{engine="{engine.host}"}} 1.0',
        f'engine_resources{{engine="{engine.host}"}} 0.0',
    ):
        assert f"exitwatch_{name}" in text, name


def test_sigterm_stops_within_two_seconds_and_removes_the_socket(run_agent):
    agent = run_agent()
    sock = Path(agent.flag("--status-socket"))
    assert sock.exists()
    agent.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: agent.proc.poll() is not None, timeout=2.0, what="the agent to exit")
    assert agent.proc.returncode == 0
    assert not sock.exists()


def test_sighup_reloads_the_config(run_agent, tmp_path):
    config = tmp_path / "config.toml"
    config.write_text(NO_LEFTOVERS + "dry_run = true\n")
    agent = run_agent("--config", str(config))
    config.write_text(NO_LEFTOVERS + "dry_run = false\nreap_attempts = 4\n")
    agent.proc.send_signal(signal.SIGHUP)
    agent.wait_log("config reloaded")
    agent.wait_log("ready:", count=2)
    settings = json.loads(status(agent, "--json").stdout)["agent"]["config"]
    assert (settings["dry_run"], settings["reap_attempts"]) == (False, 4)
    config.write_text(NO_LEFTOVERS + "reap_attempts = 99\n")
    agent.proc.send_signal(signal.SIGHUP)
    agent.wait_log("config not reloaded")
    agent.wait_log("ready:", count=3)
    assert json.loads(status(agent, "--json").stdout)["agent"]["config"]["reap_attempts"] == 4


def test_sd_notify_ready_and_watchdog(run_agent, tmp_path):
    path = tempfile.mktemp(prefix="exitwatch-notify-")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(path)
        sock.settimeout(10)
        try:
            run_agent(env={"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "200000"}, ready=False)
            seen: set[str] = set()
            while not {"READY=1", "WATCHDOG=1"} <= seen:
                seen.update(sock.recv(4096).decode().splitlines())
        finally:
            os.unlink(path)


def test_json_log_lines(engine, run_agent):
    agent = run_agent("--log-format", "json")
    owner = spawn_owner()
    cid = container(engine, owner.pid)
    agent.wait_holding(owner.pid, containers=1)
    kill(owner)
    wait_gone(engine, [cid])
    agent.wait_log('"event": "reaped"')
    lines = [json.loads(line) for line in agent.text().splitlines()]
    [reap] = [line for line in lines if line.get("event") == "reaped"]
    assert reap["kind"] == "container"
    assert reap["owner"] == str(owner.owner)
    assert "killed by SIGKILL" in reap["death"]


def test_engine_restart_shows_in_status_and_catches_up(engine, run_agent):
    agent = run_agent()
    owner = spawn_owner()
    cid = container(engine, owner.pid)
    wait_for(lambda: json.loads(status(agent, "--json").stdout)["owners"], what="the owner")
    engine.stop()
    wait_for(
        lambda: not json.loads(status(agent, "--json").stdout)["docker"]["connected"],
        what="status to show the engine down",
    )
    kill(owner)  # dies while the engine is down
    engine.start()
    wait_gone(engine, [cid])
    wait_for(lambda: agent.status()["docker"]["connected"], what="the engine followed again")
    assert agent.status()["docker"]["reconnects"] >= 1
    assert agent.alive()


def test_status_socket_ignores_what_clients_send_and_survives_ones_that_never_read(
    engine, run_agent, root
):
    agent = run_agent()
    path = agent.flag("--status-socket")
    assert oct(os.stat(path).st_mode & 0o777) == "0o660"
    hostile = []
    for _ in range(20):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(path)
        s.setblocking(False)
        # Never read, let alone obeyed; the agent may have answered and closed already.
        with contextlib.suppress(BlockingIOError, BrokenPipeError, ConnectionResetError):
            s.send(b'{"reap": "everything"}\n' * 100)
        hostile.append(s)  # and none of them ever reads its answer
    try:
        owner = spawn_owner()
        alive = spawn_owner()
        cid, kept = container(engine, owner.pid), container(engine, alive.pid)
        kill(owner)
        wait_gone(engine, [cid])
        assert exists(engine, kept)
        wait_for(
            lambda: agent.status()["counters"].get("reaped_container") == 1,
            what="the removal counted",
        )
    finally:
        for s in hostile:
            s.close()
    kill(alive)
