"""The process kind: a dead run's leftover processes, those whose environment carries
EXITWATCH_OWNER and EXITWATCH_RUN naming the dead owner, are killed; nobody else's are.

A fake run is a real process standing for `exitwatch run`'s wrapper (the owner), whose
child calls setsid, carries the variable and survives the owner's SIGKILL, as a runner's
background process does. The run belongs to the unprivileged `exitwatch-test` user.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from exitwatch import procfs
from exitwatch.kinds.base import Resource, Snapshot
from exitwatch.kinds.processes.kind import (
    KIND,
    PF_KTHREAD,
    RUN_VARIABLE,
    VARIABLE,
    Processes,
)
from exitwatch.owner import Owner, owner_of
from exitwatch.service.config import Config
from exitwatch.service.daemon import make_kinds

from support.agentproc import Agent, running
from support.procs import wait_for
from support.users import as_user

# The wrapper: reads its owner string, starts a leftover in a session of its own that
# tells its pid, then stays (exec keeps the pid and start time, so the owner stays valid).
_RUN = (
    'read owner; EXITWATCH_OWNER="$owner" EXITWATCH_RUN="$owner" '
    "setsid sh -c 'echo $$; exec sleep 1000000' </dev/null 2>/dev/null & exec sleep 1000000"
)
# A shell that ran `eval "$(exitwatch labels --format env)"`: the owner alone, no run.
_SHELL = _RUN.replace('EXITWATCH_RUN="$owner" ', "")
DEADLINE = 30.0  # for a correct agent on a loaded machine, not a measure of its speed


class Proc:
    """One process, pinned by (pid, start time)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.starttime = procfs.read_stat(pid).starttime

    def ended(self) -> bool:
        try:
            stat = procfs.read_stat(self.pid)
        except ProcessLookupError:
            return True
        return stat.starttime != self.starttime or stat.state in ("Z", "X")

    def kill(self) -> None:
        if not self.ended():
            os.kill(self.pid, signal.SIGKILL)


class FakeRun:
    """A live run of `user` (root when None) with one leftover-to-be."""

    def __init__(self, user=None, script: str = _RUN) -> None:
        pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE}
        if user is None:
            self.proc = subprocess.Popen(["/bin/sh", "-c", script], **pipes)
        else:
            self.proc = as_user(user, script, **pipes)
        self.owner: Owner = owner_of(self.proc.pid)
        self.proc.stdin.write(f"{self.owner}\n".encode())
        self.proc.stdin.close()
        self.leftover = Proc(int(self.proc.stdout.readline()))
        self.proc.stdout.close()
        self.others: list[subprocess.Popen] = []

    def carrier(self, user=None) -> Proc:
        """Another process carrying this run's owner, not a descendant of it: started by
        `user` who set the variable by hand, or by root (as through `sudo -E`)."""
        env = os.environ | {VARIABLE: str(self.owner), RUN_VARIABLE: str(self.owner)}
        argv = ["sleep", "1000000"]
        proc = subprocess.Popen(argv if user is None else _as(user, *argv), env=env)
        self.others.append(proc)
        return Proc(proc.pid)

    def kill(self) -> None:
        """SIGKILL the wrapper: the leftover lives on, reparented."""
        self.proc.kill()
        self.proc.wait()

    def close(self) -> None:
        self.kill()
        self.leftover.kill()
        for proc in self.others:
            proc.kill()
            proc.wait()


@pytest.fixture
def runs() -> Iterator[list[FakeRun]]:
    made: list[FakeRun] = []
    yield made
    for run in made:
        run.close()


def _holding(agent: Agent, run: FakeRun, n: int) -> None:
    def held() -> bool:
        mine = [o for o in agent.status()["owners"] if o["owner"] == str(run.owner)]
        return bool(mine) and len(mine[0].get("processes", [])) == n

    wait_for(held, timeout=DEADLINE, what=f"the agent to hold {n} processes of {run.owner}")


def _audit(agent: Agent) -> list[dict]:
    path = Path(agent.flag("--audit-log"))
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def _recorded(agent: Agent, proc: Proc, refused: bool = False) -> dict:
    def entry() -> dict | None:
        for reap in _audit(agent):
            mine = reap["kind"] == KIND and f"process {proc.pid} " in reap["what"]
            if mine and reap["refused"] == refused:
                return reap
        return None

    return wait_for(entry, timeout=DEADLINE, what=f"the audit entry of process {proc.pid}")


def test_dead_runs_leftovers_are_killed_and_nobody_elses(
    engine, workroot, tmp_path, attacker, runs
):
    with running(engine, workroot, tmp_path / "agent.log") as agent:
        dead, live = FakeRun(attacker), FakeRun(attacker)
        runs += [dead, live]
        # Carrying the dead run's owner: a root process (the variable kept through sudo)
        # and a process of the live run's user that is no descendant of the run.
        rooted = dead.carrier()
        _holding(agent, dead, 2)
        _holding(agent, live, 1)

        dead.kill()
        wait_for(dead.leftover.ended, timeout=DEADLINE, what="the leftover killed")
        killed = _recorded(agent, dead.leftover)
        assert killed["ok"] and killed["result"] == "killed (SIGKILL)"
        assert killed["owner"] == str(dead.owner) and killed["death"]
        refused = _recorded(agent, rooted, refused=True)
        assert f"are not the run's uid {attacker.pw_uid}" in refused["result"]
        assert not rooted.ended()

        # A leftover that shows up after the run's death goes at the next rescan, even
        # once a rescan found nothing carrying the run (its uid is kept a while).
        rooted.kill()
        wait_for(rooted.ended, timeout=DEADLINE, what="the root carrier gone")
        probe = FakeRun(attacker)  # seen only by a rescan that came after the carrier
        runs.append(probe)
        _holding(agent, probe, 1)
        late = dead.carrier(attacker)
        wait_for(late.ended, timeout=DEADLINE, what="the late leftover killed")

        assert not live.leftover.ended()
        _holding(agent, live, 1)
        rescans = agent.status()["processes"]
        assert rescans["rescans"] > 0 and rescans["failing"] == 0
        shown = [r for r in agent.status()["reaps"] if r["kind"] == KIND and r["ok"]]
        assert {r["what"].split()[1] for r in shown} >= {str(dead.leftover.pid), str(late.pid)}


def test_a_leftover_after_a_rescan_with_no_carrier_meets_the_runs_uid(attacker, runs):
    kind, run = _dead_run_known(attacker, runs)
    found = [r for r in kind.scan().resources if r.owner == run.owner]
    outcomes = kind.remove(run.owner, found, dry_run=False)
    assert [o.detail for o in outcomes] == ["killed (SIGKILL)"]
    assert [o.key for o in outcomes] == [r.key for r in found]  # only failures are retried
    assert not [r for r in kind.scan().resources if r.owner == run.owner]
    late = _orphan(_as(attacker, "sleep", "1000000"), _carrying(run.owner))
    try:
        found = [r for r in kind.scan().resources if r.owner == run.owner]
        (outcome,) = kind.remove(run.owner, found, dry_run=False)
        assert outcome.detail == "killed (SIGKILL)" and late.ended()
    finally:
        late.kill()


def test_a_shell_that_exported_only_the_owner_leaves_its_jobs_alive(
    engine, workroot, tmp_path, attacker, runs
):
    with running(engine, workroot, tmp_path / "agent.log") as agent:
        shell, run = FakeRun(attacker, _SHELL), FakeRun(attacker)
        runs += [shell, run]
        _holding(agent, run, 1)
        shell.kill()
        run.kill()
        # Both died together: once the run's leftover is killed, the shell's job has been
        # judged too, and it lives.
        wait_for(run.leftover.ended, timeout=DEADLINE, what="the run's leftover killed")
        assert _recorded(agent, run.leftover)["ok"]
        assert not shell.leftover.ended()
        assert not [r for r in _audit(agent) if r["owner"] == str(shell.owner)]


def test_a_failing_rescan_is_tried_again_and_shown_in_health(monkeypatch):
    # Pure loop logic: the fault is injected, the rescan after it is the real one.
    kind = Processes(interval=0.05)
    real, calls = kind._seen.rescan, []

    def flaky(full: bool = True) -> dict:
        calls.append(None)
        if len(calls) <= 2:
            raise OSError("injected")
        return real(full)

    monkeypatch.setattr(kind._seen, "rescan", flaky)
    changes: list = []
    kind.start(changes.append)
    try:
        wait_for(lambda: any(isinstance(c, Snapshot) for c in changes), what="a Snapshot")
        health = kind.health()
        assert health["failures"] == 2 and health["failing"] == 0
        assert health["rescans"] >= 1 and "injected" in health["last_error"]
    finally:
        kind.stop()


def test_kill_leftovers_false_has_no_process_kind():
    assert any(isinstance(k, Processes) for k in make_kinds(Config()))
    assert not any(isinstance(k, Processes) for k in make_kinds(Config(kill_leftovers=False)))


def test_anothers_process_carrying_a_root_runs_owner_is_left(
    engine, workroot, tmp_path, attacker, runs
):
    with running(engine, workroot, tmp_path / "agent.log") as agent:
        run = FakeRun()
        runs.append(run)
        planted = run.carrier(attacker)
        _holding(agent, run, 2)
        run.kill()
        wait_for(run.leftover.ended, timeout=DEADLINE, what="the root run's leftover killed")
        refused = _recorded(agent, planted, refused=True)
        assert "are not the run's uid 0" in refused["result"]
        assert not planted.ended()


def _resource(owner: Owner, proc: Proc) -> Resource:
    return Resource(KIND, f"{proc.pid}:{proc.starttime}", owner, name=f"process {proc.pid}")


def test_a_run_never_seen_alive_has_its_leftovers_refused(attacker, runs):
    run = FakeRun(attacker)
    runs.append(run)
    run.kill()
    kind = Processes()  # it never saw the wrapper alive: the run's uid is unknown
    found = [r for r in kind.scan().resources if r.owner == run.owner]
    assert [r.key for r in found] == [f"{run.leftover.pid}:{run.leftover.starttime}"]
    (outcome,) = kind.remove(run.owner, found, dry_run=False)
    assert outcome.refused and "uid is unknown" in outcome.detail
    assert not run.leftover.ended()


def test_a_live_runs_processes_are_refused(attacker, runs):
    run = FakeRun(attacker)
    runs.append(run)
    kind = Processes()
    found = [r for r in kind.scan().resources if r.owner == run.owner]
    (outcome,) = kind.remove(run.owner, found, dry_run=False)
    assert outcome.refused and "is alive" in outcome.detail
    assert not run.leftover.ended()


def test_dry_run_kills_nothing(attacker, runs):
    run = FakeRun(attacker)
    runs.append(run)
    kind = Processes()
    found = [r for r in kind.scan().resources if r.owner == run.owner]
    run.kill()
    (outcome,) = kind.remove(run.owner, found, dry_run=True)
    assert outcome.ok and outcome.detail == "would kill"
    assert not run.leftover.ended()


def _pids() -> list[int]:
    return [int(d) for d in os.listdir("/proc") if d.isdigit()]


def _flags(pid: int) -> int:
    try:
        return procfs.read_stat(pid).flags
    except ProcessLookupError:
        return 0


def test_pid_one_a_kernel_thread_and_the_agent_are_never_killed(attacker, runs):
    run = FakeRun(attacker)
    runs.append(run)
    kind = Processes()
    kind.scan()  # learns the run's uid
    run.kill()
    kthread = next((p for p in _pids() if _flags(p) & PF_KTHREAD), None)
    if kthread is None:
        pytest.skip("no kernel thread is visible in this pid namespace")
    for pid in (1, kthread, os.getpid()):
        (outcome,) = kind.remove(run.owner, [_resource(run.owner, Proc(pid))], dry_run=False)
        assert outcome.refused and "pid 1, a kernel thread or the agent" in outcome.detail


def _as(user, *argv: str) -> list[str]:
    ids = [f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups"]
    return ["setpriv", *ids, *argv]


def _orphan(argv: list[str], env: dict[str, str], comm: str = "sleep") -> Proc:
    """A process started through a shell that exits at once: no descendant of this test
    (which plays the agent when it drives the kind itself). Returned once it runs `comm`."""
    script = '"$@" </dev/null >/dev/null 2>&1 & echo $!'
    out = subprocess.run(["sh", "-c", script, "sh", *argv], env=env, capture_output=True)
    proc = Proc(int(out.stdout))
    wait_for(lambda: procfs.read_stat(proc.pid).comm == comm, what=f"{comm} to run")
    # An exec names the process before it sets up the new environment, which /proc shows
    # empty until then.
    wait_for(lambda: psutil.Process(proc.pid).environ(), what=f"{comm}'s environment")
    return proc


def _carrying(owner: Owner) -> dict[str, str]:
    return os.environ | {VARIABLE: str(owner), RUN_VARIABLE: str(owner)}


def test_a_runs_leftovers_are_killed_together(attacker, runs):
    run = FakeRun(attacker)
    runs.append(run)
    kind = Processes()
    kind.scan()  # learns the run's uid
    more = [_orphan(_as(attacker, "sleep", "1000000"), _carrying(run.owner)) for _ in range(3)]
    run.kill()
    try:
        found = [r for r in kind.scan().resources if r.owner == run.owner]
        assert len(found) == 4
        outcomes = kind.remove(run.owner, found, dry_run=False)
        assert [o.detail for o in outcomes] == ["killed (SIGKILL)"] * 4
        assert all(p.ended() for p in [run.leftover, *more])
    finally:
        for proc in more:
            proc.kill()


def _dead_run_known(user, runs: list[FakeRun]) -> tuple[Processes, FakeRun]:
    """A kind that saw `user`'s run alive (so it knows the run's uid), and the run, dead."""
    run = FakeRun(user)
    runs.append(run)
    kind = Processes()
    kind.scan()
    run.kill()
    return kind, run


def _judged(kind: Processes, owner: Owner, proc: Proc) -> str:
    (outcome,) = kind.remove(owner, [_resource(owner, proc)], dry_run=False)
    assert outcome.refused and not proc.ended(), outcome
    return outcome.detail


def test_an_environment_read_empty_is_a_failure_to_retry_not_a_refusal(attacker, runs, monkeypatch):
    kind, run = _dead_run_known(attacker, runs)
    res = _resource(run.owner, run.leftover)
    read = psutil.Process.environ
    monkeypatch.setattr(psutil.Process, "environ", lambda self: {})  # caught mid-exec
    (outcome,) = kind.remove(run.owner, [res], dry_run=False)
    assert not outcome.ok and not outcome.refused and "reads empty" in outcome.detail
    assert not run.leftover.ended()
    monkeypatch.setattr(psutil.Process, "environ", read)  # the retry, once the exec is done
    (outcome,) = kind.remove(run.owner, [res], dry_run=False)
    assert outcome.ok and outcome.detail == "killed (SIGKILL)"


def test_the_agents_own_descendant_is_refused(attacker, runs):
    kind, run = _dead_run_known(attacker, runs)
    child = subprocess.Popen(_as(attacker, "sleep", "1000000"), env=_carrying(run.owner))
    try:
        wait_for(lambda: procfs.read_stat(child.pid).comm == "sleep", what="the exec")
        detail = _judged(kind, run.owner, Proc(child.pid))
        assert "the agent's own descendant" in detail
    finally:
        child.kill()
        child.wait()


def test_a_process_of_another_pid_namespace_is_refused(attacker, runs):
    kind, run = _dead_run_known(attacker, runs)
    argv = ["unshare", "--pid", "--fork", *_as(attacker, "sleep", "1000000")]
    outer = _orphan(argv, _carrying(run.owner), comm="unshare")
    try:

        def inner() -> int | None:
            kids = psutil.Process(outer.pid).children()
            return kids[0].pid if kids and kids[0].name() == "sleep" else None

        proc = Proc(wait_for(inner, what="the sleep in its own pid namespace"))
        try:
            assert _resource(run.owner, proc).key not in {r.key for r in kind.scan().resources}
            assert "another pid namespace" in _judged(kind, run.owner, proc)
        finally:
            proc.kill()
    finally:
        outer.kill()


def test_a_leftover_whose_uids_are_mixed_is_refused(attacker, runs):
    kind, run = _dead_run_known(attacker, runs)
    # Real uid the run's, effective and saved root: what a setuid-root program looks like.
    argv = ["setpriv", f"--ruid={attacker.pw_uid}", "--euid=0", "sleep", "1000000"]
    proc = _orphan(argv, _carrying(run.owner))
    try:
        assert tuple(psutil.Process(proc.pid).uids()) == (attacker.pw_uid, 0, 0)
        detail = _judged(kind, run.owner, proc)
        assert f"are not the run's uid {attacker.pw_uid}" in detail
    finally:
        proc.kill()


def _take_pid(pid: int, argv: list[str], env: dict[str, str]) -> subprocess.Popen | None:
    """A new process at `pid` (reused through ns_last_pid), or None if another fork won."""
    with open("/proc/sys/kernel/ns_last_pid", "w") as f:
        f.write(str(pid - 1))
    proc = subprocess.Popen(argv, env=env)
    if proc.pid == pid:
        return proc
    proc.kill()
    proc.wait()
    return None


def test_a_reused_pid_is_not_killed(attacker):
    wrapper = subprocess.Popen(_as(attacker, "sleep", "1000000"))
    owner = owner_of(wrapper.pid)
    env = os.environ | {VARIABLE: str(owner), RUN_VARIABLE: str(owner)}
    # The leftover is this test's own child, so that its pid is freed once it is reaped.
    leftover = subprocess.Popen(_as(attacker, "sleep", "1000000"), env=env)
    wait_for(lambda: procfs.read_stat(leftover.pid).comm == "sleep", what="the exec")
    kind = Processes()
    (res,) = [r for r in kind.scan().resources if r.owner == owner]
    wrapper.kill()
    wrapper.wait()
    leftover.kill()
    leftover.wait()
    # The same pid, the same user and the same owner, as the worst case: only the start
    # time tells the successor apart.
    for _ in range(20):
        successor = _take_pid(leftover.pid, _as(attacker, "sleep", "1000000"), env)
        if successor is not None:
            break
    else:
        pytest.skip(f"could not get pid {leftover.pid} again on this busy machine")
    try:
        (outcome,) = kind.remove(owner, [res], dry_run=False)
        assert outcome.ok and outcome.detail == "already gone"
        assert successor.poll() is None
    finally:
        successor.kill()
        successor.wait()
