"""The agent's promises about its own life: `--dry-run`, STOPPING=1, SIGTERM with a removal
in flight, and the metrics docs/metrics.md lists. Real agent processes against the real
engine and kernel."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exitwatch import mark_workdir

from support.agentproc import Agent, Agents, container, exists, free_port, scrape, wait_gone
from support.procs import kill, spawn_owner, wait_for

METRICS_DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
EXITWATCH = [sys.executable, "-m", "exitwatch"]


@pytest.fixture
def run_agent(engine, workroot, tmp_path):
    agents = Agents(engine.host, workroot, tmp_path)
    yield agents.start
    agents.stop()


def status_text(agent: Agent) -> str:
    sock = agent.flag("--status-socket")
    return subprocess.run(
        [*EXITWATCH, "status", "--status-socket", sock],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout


def workdir(root: Path, pid: int, name: str = "w") -> Path:
    path = root / name
    (path / "sub").mkdir(parents=True)
    for i in range(20):
        (path / "sub" / f"f{i}").write_bytes(b"x" * 100)
    mark_workdir(path, pid)
    return path


# -- --dry-run ------------------------------------------------------------------------------


def test_agent_dry_run_reports_and_removes_nothing(engine, run_agent, workroot):
    agent = run_agent("--dry-run")
    owner = spawn_owner()
    cid = container(engine, owner.pid)
    path = workdir(workroot, owner.pid)
    agent.wait_holding(owner.pid, containers=1, workdirs=1)
    kill(owner)
    agent.wait_log(f"would reap container {cid[:12]}")
    agent.wait_log(f"would reap workdir {path}")
    doc = agent.status()
    assert doc["agent"]["dry_run"] is True
    assert sorted(r["kind"] for r in doc["reaps"]) == ["container", "workdir"]
    assert all(r["dry_run"] and r["ok"] for r in doc["reaps"]), doc["reaps"]
    assert doc["counters"].get("reaped_container", 0) == 0
    assert "  dry run:  nothing is removed" in status_text(agent).splitlines()
    assert exists(engine, cid)
    assert engine.client.api.inspect_container(cid)["State"]["Running"]
    assert len(list((path / "sub").iterdir())) == 20 and (path / ".exitwatch-owner").exists()


# -- systemd --------------------------------------------------------------------------------


@contextlib.contextmanager
def _notify_socket() -> Iterator[socket.socket]:
    """A socket bound where NOTIFY_SOCKET will point, as systemd's is, for 30 s reads."""
    path = tempfile.mktemp(prefix="exitwatch-notify-")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(path)
        sock.settimeout(30)
        try:
            yield sock
        finally:
            os.unlink(path)


def _until(sock: socket.socket, seen: list[str], message: str) -> None:
    """Read notifications into `seen` until `message` is among them."""
    while message not in seen:
        seen += sock.recv(4096).decode().splitlines()


def test_sd_notify_stopping_on_sigterm(run_agent):
    with _notify_socket() as sock:
        agent = run_agent(env={"NOTIFY_SOCKET": sock.getsockname()}, ready=False)
        seen: list[str] = []
        _until(sock, seen, "READY=1")
        agent.proc.send_signal(signal.SIGTERM)
        _until(sock, seen, "STOPPING=1")
        assert agent.proc.wait(timeout=30) == 0
    assert seen.index("READY=1") < seen.index("STOPPING=1")


def test_sighup_tells_systemd_reloading_then_ready_never_stopping(run_agent):
    """A reload keeps the process: systemd hears RELOADING=1 (with the time it began) and
    then READY=1. STOPPING=1 there made systemd take the reload for a stop it had not asked,
    and SIGKILL the agent 10 s later (TimeoutStopSec=); SIGTERM still says STOPPING=1."""
    with _notify_socket() as sock:
        agent = run_agent(env={"NOTIFY_SOCKET": sock.getsockname()}, ready=False)
        seen: list[str] = []
        _until(sock, seen, "READY=1")
        for _ in range(2):  # a reload, and another on the reloaded run
            del seen[:]
            agent.proc.send_signal(signal.SIGHUP)
            _until(sock, seen, "READY=1")
            assert seen[0] == "RELOADING=1" and "STOPPING=1" not in seen, seen
            usec = int(next(m for m in seen if m.startswith("MONOTONIC_USEC=")).split("=")[1])
            assert 0 < time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000 - usec < 30e6
            assert agent.proc.poll() is None
        agent.proc.send_signal(signal.SIGTERM)
        _until(sock, seen, "STOPPING=1")
        assert agent.proc.wait(timeout=30) == 0


# -- SIGTERM with a removal in flight -------------------------------------------------------


@pytest.fixture
def freezable() -> Iterator[tuple[Path, Callable]]:
    """A small ext4 file system of the test's own, and a switch that freezes it.

    A frozen file system blocks every write in the kernel (unlink and rmdir included) until
    it is thawed: a removal that really hangs, the way one on a stuck disk or an NFS server
    that went away does, and that ends exactly when the test says.
    """
    top = Path(tempfile.mkdtemp(prefix="exitwatch-frz-"))
    image, mnt = top / "fs.img", top / "mnt"
    mnt.mkdir()
    with image.open("wb") as f:
        f.truncate(32 << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
    subprocess.run(["mount", "-o", "loop", str(image), str(mnt)], check=True)
    frozen = False

    def freeze(on: bool) -> None:
        nonlocal frozen
        if on != frozen:
            subprocess.run(["fsfreeze", "-f" if on else "-u", str(mnt)], check=True)
            frozen = on

    try:
        yield mnt, freeze
    finally:
        freeze(False)
        subprocess.run(["umount", str(mnt)], check=False)
        shutil.rmtree(top, ignore_errors=True)


def test_sigterm_abandons_a_hung_removal_at_the_deadline_and_the_next_start_redoes_it(
    run_agent, freezable
):
    mnt, freeze = freezable
    agent = run_agent(root=mnt)
    try:
        owner = spawn_owner()
        path = workdir(mnt, owner.pid)
        agent.wait_holding(owner.pid, workdirs=1)
        freeze(True)
        kill(owner)
        wait_for(
            lambda: [p["state"] for p in agent.status()["pending"]] == ["removing"],
            timeout=30,
            what="the removal to be under way",
        )
        [line] = [x for x in status_text(agent).splitlines() if str(owner.owner) in x]
        assert line.startswith(f"  {owner.owner} (") and "killed by SIGKILL" in line, line
        assert line.endswith(f"): {path} [attempt 1, removing]"), line
        sock = Path(agent.flag("--status-socket"))
        asked = time.monotonic()
        agent.proc.send_signal(signal.SIGTERM)
        agent.wait_log("1 removals under way abandoned at shutdown; a restart redoes them")
        waited = time.monotonic() - asked
        agent.wait_log("exitwatch stopped")
        # The removal got what was left of the shutdown time before it was given up.
        assert waited >= 1.0, waited
        assert not sock.exists()
    finally:
        # The hung thread ends (and the process with it) once its write may go on.
        freeze(False)
    assert agent.proc.wait(timeout=30) == 0
    assert (path / ".exitwatch-owner").exists()  # the marker goes last: still claimed

    again = run_agent(root=mnt)
    wait_gone(None, paths=[path])
    again.wait_log(f"reaped workdir {path}")
    again.stop()  # before the file system it watches is unmounted


# -- metrics --------------------------------------------------------------------------------


def documented_metrics() -> dict[str, tuple[str, tuple[str, ...]]]:
    """name -> (type, label names), from the table under docs/metrics.md's "## Metrics"."""
    section = METRICS_DOC.read_text().split("\n## Metrics\n", 1)[1].split("\n#", 1)[0]
    rows = {}
    for line in section.splitlines():
        m = re.fullmatch(r"\| `(exitwatch_\w+)(?:\{([\w,]+)\})?` \| (\w+) \|.*", line.strip())
        if m:
            labels = tuple(m.group(2).split(",")) if m.group(2) else ()
            rows[m.group(1)] = (m.group(3), labels)
    return rows


def test_every_metric_in_the_docs_table_is_served_as_the_table_says(engine, run_agent, workroot):
    table = documented_metrics()
    assert len(table) >= 10, table  # the table was found and read
    port = free_port()
    run_agent("--metrics-addr", f"127.0.0.1:{port}")
    alive, dead = spawn_owner(), spawn_owner()
    container(engine, alive.pid)
    workdir(workroot, alive.pid, "alive")
    cid = container(engine, dead.pid)
    path = workdir(workroot, dead.pid, "dead")
    kill(dead)
    wait_gone(engine, [cid], [path])

    def settled() -> dict | None:
        families = {f.name: f for f in text_string_to_metric_families(scrape(port, 10))}
        reaped = families.get("exitwatch_reaped")
        kinds = {s.labels.get("kind") for s in reaped.samples} if reaped else set()
        return families if {"container", "workdir"} <= kinds else None

    families = wait_for(settled, timeout=30, what="both removals in the metrics")
    served = {}
    for family in families.values():
        # The parser names a counter's family without its _total suffix.
        name = family.name + "_total" if family.type == "counter" else family.name
        served[name] = family
    # prometheus_client may add the creation time of a counter's or a histogram's series,
    # as a gauge of its own.
    for name, (kind, _) in table.items():
        if kind in ("counter", "histogram"):
            served.pop(f"{name.removesuffix('_total')}_created", None)
    assert sorted(served) == sorted(table)
    for name, (kind, labels) in table.items():
        family = served[name]
        assert family.type == kind, (name, family.type)
        # A labelled family has no series until something happens to one of its labels.
        assert family.samples or labels, name
        for sample in family.samples:
            assert set(sample.labels) - {"le"} == set(labels), (name, sample)
    kill(alive)
