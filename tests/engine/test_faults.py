"""Faults the agent must survive: the engine killed or absent, the agent itself killed, the
kernel dropping exit events, a removal that keeps failing, a full fd table, too few inotify
watches. Real agent processes, a real engine, real signals. /proc entries vanishing
mid-read are in unit/test_procfs_vanishing.py and system/test_procfs_races.py."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from exitwatch import mark_workdir
from exitwatch.contract import LABEL_OWNER
from exitwatch.sources import ebpf
from exitwatch.sources.netlink import RCVBUF_ENV

from support.agentproc import Agent, agent_argv, container, exists, wait_gone
from support.procs import fork_storm, kill, reap, spawn_owner, wait_for


@pytest.fixture
def agents() -> Iterator[list[Agent]]:
    started: list[Agent] = []
    yield started
    for agent in started:
        agent.stop()


def start(agents, engine, root, tmp_path, ready=True, env=None, source="netlink") -> Agent:
    agent = Agent(agent_argv(source, engine.host, root), tmp_path / f"agent-{len(agents)}.log", env)
    agents.append(agent)
    if ready:
        agent.wait_log("ready:")
    return agent


def workdir(root: Path, pid: int, name: str) -> Path:
    path = root / name
    (path / "sub").mkdir(parents=True)
    (path / "sub" / "data").write_bytes(b"x" * 1000)
    mark_workdir(path, pid)
    return path


EBPF_PROBLEM = ebpf.probe() if os.path.exists(ebpf.OBJ_PATH) else None
SOURCES = [
    pytest.param(
        "ebpf",
        marks=pytest.mark.skipif(EBPF_PROBLEM is not None, reason=f"no eBPF: {EBPF_PROBLEM}"),
    ),
    "netlink",
    "poll",
]


def dockerd_pid(engine) -> int:
    return int((engine.dir / "dockerd.pid").read_text())


# The engine


def test_engine_sigkilled_mid_run_then_restarted(engine, agents, workroot, tmp_path):
    agent = start(agents, engine, workroot, tmp_path)
    doomed, alive = spawn_owner(), spawn_owner()
    doomed_cid, alive_cid = container(engine, doomed.pid), container(engine, alive.pid)
    doomed_dir = workdir(workroot, doomed.pid, "doomed")
    try:
        os.kill(dockerd_pid(engine), signal.SIGKILL)
        agent.wait_log("reconnecting", "the agent to notice the engine is gone")
        kill(doomed)
        # Workdirs do not wait for the engine.
        wait_gone(engine, paths=[doomed_dir])
    finally:
        engine.start()
    wait_gone(engine, [doomed_cid])
    assert exists(engine, alive_cid)
    assert agent.alive()
    reap(alive)


def test_no_engine_at_start_then_it_appears(engine, agents, workroot, tmp_path):
    doomed, alive = spawn_owner(), spawn_owner()
    doomed_cid, alive_cid = container(engine, doomed.pid), container(engine, alive.pid)
    engine.stop()
    try:
        assert not engine.socket.exists()
        kill(doomed)
        agent = start(agents, engine, workroot, tmp_path, ready=False)
        agent.wait_log("reconnecting", "the agent to say the engine does not answer")
        late = spawn_owner()
        late_dir = workdir(workroot, late.pid, "late")
        kill(late)
        wait_gone(engine, paths=[late_dir])
    finally:
        engine.start()
    agent.wait_log("ready:")
    wait_gone(engine, [doomed_cid])
    assert exists(engine, alive_cid)
    assert agent.alive()
    reap(alive)


# The agent


def test_agent_sigkilled_then_restarted_reaps_what_died_meanwhile(
    engine, agents, workroot, tmp_path
):
    first = start(agents, engine, workroot, tmp_path)
    doomed, alive = spawn_owner(), spawn_owner()
    cid, kept_cid = container(engine, doomed.pid), container(engine, alive.pid)
    path, kept_dir = workdir(workroot, doomed.pid, "doomed"), workdir(workroot, alive.pid, "kept")
    first.kill()
    kill(doomed)
    start(agents, engine, workroot, tmp_path)
    wait_gone(engine, [cid], [path])
    assert exists(engine, kept_cid) and (kept_dir / "sub" / "data").exists()
    reap(alive)


# The kernel drops exit events


def test_enobufs_during_a_fork_storm_misses_no_reap(engine, agents, workroot, tmp_path):
    doomed = [spawn_owner() for _ in range(12)]
    alive = [spawn_owner() for _ in range(2)]
    dirs = [workdir(workroot, o.pid, f"doomed-{i}") for i, o in enumerate(doomed)]
    kept = [workdir(workroot, o.pid, f"kept-{i}") for i, o in enumerate(alive)]
    cid, kept_cid = container(engine, doomed[0].pid), container(engine, alive[0].pid)
    # Everything exists before the agent starts, so "ready" means every owner is watched.
    # The kernel raises a 1-byte buffer to its minimum: a handful of events.
    agent = start(agents, engine, workroot, tmp_path, ready=False, env={RCVBUF_ENV: "1"})
    agent.wait_log("ready: watching 14 owners")
    # Stopped, the agent reads nothing: the storm fills its buffer, so every owner's exit
    # event is dropped and only the resync can find them.
    before = agent.status()["counters"]["resyncs"]  # the startup may overflow it too
    os.kill(agent.pid, signal.SIGSTOP)
    try:
        fork_storm(300)
        for owner in doomed:
            kill(owner)
    finally:
        os.kill(agent.pid, signal.SIGCONT)
    wait_for(lambda: agent.status()["counters"]["resyncs"] > before, what="a resync")
    assert "netlink receive buffer overflowed (ENOBUFS)" in agent.text()
    wait_gone(engine, [cid], dirs)
    assert exists(engine, kept_cid)
    assert all((d / "sub" / "data").exists() for d in kept)
    for owner in alive:
        reap(owner)


# A removal that keeps failing


def _stamps(text: str, needle: str) -> list[datetime]:
    return [
        datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
        for line in text.splitlines()
        if needle in line
    ]


def test_a_removal_that_keeps_failing_is_retried_bounded_and_blocks_nothing(
    engine, agents, workroot, tmp_path
):
    agent = start(agents, engine, workroot, tmp_path)
    stuck_owner, other = spawn_owner(), spawn_owner()
    stuck = workdir(workroot, stuck_owner.pid, "stuck")
    immutable = stuck / "sub" / "data"
    other_dir = workdir(workroot, other.pid, "other")
    other_cid = container(engine, other.pid)
    subprocess.run(["chattr", "+i", str(immutable)], check=True)
    try:
        failed = f"failed workdir {stuck} "
        kill(stuck_owner)
        agent.wait_log(failed, "the first failed removal")
        # While the stuck one waits for its retries, another owner's death is reaped.
        kill(other)
        wait_gone(engine, [other_cid], [other_dir])
        agent.wait_log(failed, "the third attempt", count=3)
        agent.wait_log("giving up on the workdirs of", "the agent to give up")
        text = agent.text()
    finally:
        subprocess.run(["chattr", "-i", str(immutable)], check=True)
    assert "data" in next(line for line in text.splitlines() if failed in line)
    first, second, third = _stamps(text, failed)  # three attempts, and no fourth
    # The backoff is 0.5 s, then 2 s; a log stamp is to the millisecond.
    assert (second - first).total_seconds() >= 0.499
    assert (third - second).total_seconds() >= 1.999
    assert immutable.exists() and (stuck / ".exitwatch-owner").exists()
    assert agent.alive()


# The agent's fd table is full


def _cpu_seconds(pid: int) -> float:
    """utime + stime (fields 14 and 15 of /proc/PID/stat) of the whole process."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _lowest_free_fd(pid: int) -> int:
    used = {int(fd) for fd in os.listdir(f"/proc/{pid}/fd")}
    return next(n for n in range(len(used) + 1) if n not in used)


def _nofile(pid: int) -> tuple[int, int]:
    """The soft and hard RLIMIT_NOFILE of process `pid`."""
    done = subprocess.run(
        ["prlimit", "--pid", str(pid), "--nofile", "--raw", "--noheadings", "--output=SOFT,HARD"],
        capture_output=True,
        text=True,
        check=True,
    )
    soft, hard = (int(v) for v in done.stdout.split())
    return soft, hard


@contextlib.contextmanager
def full_fd_table(pid: int) -> Iterator[None]:
    """Every fd of `pid` below its soft limit is in use: its next open() of any kind fails
    with EMFILE. The limit is restored on leaving."""
    soft, hard = _nofile(pid)
    full = _lowest_free_fd(pid)
    subprocess.run(["prlimit", "--pid", str(pid), f"--nofile={full}:{hard}"], check=True)
    try:
        yield
    finally:
        subprocess.run(["prlimit", "--pid", str(pid), f"--nofile={soft}:{hard}"], check=True)


@pytest.mark.parametrize("source", SOURCES)
def test_a_full_fd_table_delays_reaping_but_loses_nothing(
    engine, agents, workroot, tmp_path, source
):
    agent = start(agents, engine, workroot, tmp_path, source=source)
    doomed, late = spawn_owner(), spawn_owner()
    cid = container(engine, doomed.pid)
    doomed_dir = workdir(workroot, doomed.pid, "doomed")
    agent.wait_holding(doomed.pid, containers=1, workdirs=1)
    with full_fd_table(agent.pid):
        kill(doomed)
        agent.wait_log("Too many open files", "the agent to fail to read /proc")
        late_dir = workdir(workroot, late.pid, "late")  # marked while nothing can be opened
        agent.wait_log("now (Too many open files)", "discovery to fail to walk it")
        assert exists(engine, cid) and doomed_dir.exists()
        # A status client the agent cannot accept stays queued: it must not make the agent
        # spin on its readable socket.
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(agent.flag("--status-socket"))
            busy = _cpu_seconds(agent.pid)
            begun = time.monotonic()
            wait_for(lambda: time.monotonic() - begun >= 1.0, 2.0, "a second to pass")
            busy = _cpu_seconds(agent.pid) - busy
        assert busy < 0.5, f"the agent used {busy:.2f} s of CPU in 1 s, queued client pending"
    # Neither the hint nor the new workdir was dropped: both are looked at again.
    wait_gone(engine, [cid], [doomed_dir])
    agent.wait_holding(late.pid, workdirs=1)
    kill(late)
    wait_gone(engine, paths=[late_dir])
    assert agent.alive()


# A short bound, far below a periodic reconcile's interval (600 s): the re-check a second
# later must find them, not the safety net.
RECHECK_BOUND = 10.0


@pytest.mark.parametrize("source", SOURCES)
def test_an_owner_first_seen_while_the_fd_table_is_full_is_judged_again(
    engine, agents, workroot, tmp_path, source
):
    """Its container arrives on the events stream already open, while /proc cannot be
    read: neither the watch nor the confirmation may drop it."""
    agent = start(agents, engine, workroot, tmp_path, source=source)

    def arrived(owner) -> None:
        """Wait until the loop has tried to judge `owner` (and failed: EMFILE)."""
        needles = (f"owner {owner.owner} lives", "handling Found failed")
        wait_for(lambda: any(n in agent.text() for n in needles), what=f"{owner.pid} judged")

    dead, alive = spawn_owner(), spawn_owner()
    kill(dead)
    with full_fd_table(agent.pid):
        dead_cid = container(engine, labels={LABEL_OWNER: str(dead.owner)})
        arrived(dead)
        assert exists(engine, dead_cid)
    restored = time.monotonic()
    wait_for(lambda: not exists(engine, dead_cid), RECHECK_BOUND, "the dead owner's container")
    assert time.monotonic() - restored < RECHECK_BOUND
    # One judged alive once /proc can be read must be watched too: its exit is a hint.
    with full_fd_table(agent.pid):
        alive_cid = container(engine, alive.pid)
        arrived(alive)
    agent.wait_holding(alive.pid, containers=1)
    kill(alive)
    wait_for(lambda: not exists(engine, alive_cid), RECHECK_BOUND, "the later death's container")
    # EMFILE is a condition, not a bug: one line each, and no traceback anywhere.
    assert "Traceback" not in agent.text()
    assert agent.alive()


# More directories than inotify watches


def test_more_directories_than_watches_means_bounded_rescans_and_status_says_why(
    engine, agents, workroot, tmp_path
):
    for i in range(8):
        (workroot / f"dir-{i}").mkdir()
    argv = agent_argv("poll", engine.host, workroot)
    # The watch limit of a user namespace of the agent's own: the host's limit, which other
    # agents on this machine live by, stays as it is.
    script = 'echo 4 > /proc/sys/user/max_inotify_watches && exec "$@"'
    agent = Agent(
        ["unshare", "--user", "--map-root-user", "sh", "-c", script, "sh", *argv],
        tmp_path / "agent.log",
    )
    agents.append(agent)
    agent.wait_log("workdir discovery falls back to rescans: inotify watch limit reached")

    owner = spawn_owner()
    late = workdir(workroot, owner.pid, "late")
    wait_for(
        lambda: any(o["pid"] == owner.pid for o in agent.status()["owners"]),
        what="the rescan to find it",
    )
    shown = agent.status()["workdirs"]["discovery"]
    every, took = re.fullmatch(
        r"rescans every (\S+) s \(the last took (\S+) s\): inotify watch limit reached", shown
    ).groups()
    # A rescan takes at most a tenth of the time between rescans, and they are a second apart
    # at the least.
    assert float(every) >= max(1.0, float(took) * 10 * 0.99), shown
    kill(owner)
    wait_gone(engine, paths=[late])
    assert agent.alive()
