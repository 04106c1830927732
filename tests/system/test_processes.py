"""The process kind: a dead run's leftover processes, those whose environment carries
EXITWATCH_OWNER and EXITWATCH_RUN naming the dead owner, are killed; nobody else's are.

A fake run (support/runs.py) is a real process standing for `exitwatch run`'s wrapper
(the owner), whose child calls setsid, carries the variable and survives the owner's
SIGKILL, as a runner's background process does. The run belongs to the unprivileged
`exitwatch-test` user. Here the tests drive the kind itself; engine/test_processes_agent.py
runs it in a real agent.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable

import psutil
import pytest

from exitwatch import procfs
from exitwatch.contract import ENV_OWNER, ENV_RUN
from exitwatch.kinds.base import Resource
from exitwatch.kinds.processes.kind import KIND, Processes
from exitwatch.kinds.processes.table import PF_KTHREAD
from exitwatch.owner import Owner, owner_of

from support.procs import wait_for
from support.runs import CONTESTED_TRIES, FakeRun, Proc, other_agents
from support.users import setpriv_argv as _as


class _Spoilt(Exception):
    """Another agent killed a process of the case before this kind judged it."""


def _contested(case: Callable[[], None]) -> None:
    """Make `case` until no other agent spoils it. The process kind is host-wide: another
    agent with it (an installed one, with its 1 s rescans) kills a dead run's leftovers too,
    and often first. Only with one there may a case be spoilt: else it is this kind's fault."""
    for _ in range(CONTESTED_TRIES):
        try:
            return case()
        except (_Spoilt, ProcessLookupError, psutil.NoSuchProcess) as err:
            # A process this test made, gone before the kind was asked: only a killer
            # outside the test can have done that.
            assert other_agents(), f"{err!r}, with no other agent on the host"
    raise AssertionError(f"other agents spoilt all {CONTESTED_TRIES} tries of the case")


def _unspoilt(*made: Proc) -> None:
    """Raise _Spoilt if one of `made`, which this kind did not kill, has ended."""
    if gone := [p.pid for p in made if p.ended()]:
        raise _Spoilt(f"process {gone} ended, killed by nobody in this test")


def _reap(kind: Processes, owner: Owner, found: list[Resource], *made: Proc, **kw) -> list:
    """kind.reap, raising _Spoilt when another agent got to one of `made` first."""
    _unspoilt(*made)
    outcomes = kind.reap(owner, found, dry_run=kw.get("dry_run", False))
    if any(o.detail == "already gone" for o in outcomes):
        raise _Spoilt("a process was already gone when this kind came to kill it")
    return outcomes


def test_a_leftover_after_a_rescan_with_no_carrier_meets_the_runs_uid(attacker, runs):
    def case() -> None:
        kind, run = _dead_run_known(attacker, runs)
        found = [r for r in kind.scan().resources if r.owner == run.owner]
        outcomes = _reap(kind, run.owner, found, run.leftover)
        assert [o.detail for o in outcomes] == ["killed (SIGKILL)"]
        assert [o.key for o in outcomes] == [r.key for r in found]  # only failures are retried
        assert not [r for r in kind.scan().resources if r.owner == run.owner]
        late = _orphan(_as(attacker, "sleep", "1000000"), _carrying(run.owner))
        try:
            found = [r for r in kind.scan().resources if r.owner == run.owner]
            (outcome,) = _reap(kind, run.owner, found, late)
            assert outcome.detail == "killed (SIGKILL)" and late.ended()
        finally:
            late.kill()

    _contested(case)


def _resource(owner: Owner, proc: Proc) -> Resource:
    return Resource(KIND, f"{proc.pid}:{proc.starttime}", owner, name=f"process {proc.pid}")


def test_a_run_never_seen_alive_has_its_leftovers_refused(attacker, runs):
    def case() -> None:
        run = FakeRun(attacker)
        runs.append(run)
        run.kill()
        kind = Processes()  # it never saw the wrapper alive: the run's uid is unknown
        found = [r for r in kind.scan().resources if r.owner == run.owner]
        _unspoilt(run.leftover)
        assert [r.key for r in found] == [f"{run.leftover.pid}:{run.leftover.starttime}"]
        (outcome,) = _reap(kind, run.owner, found, run.leftover)
        assert outcome.refused and "uid is unknown" in outcome.detail
        _unspoilt(run.leftover)

    _contested(case)


def test_a_live_runs_processes_are_refused(attacker, runs):
    run = FakeRun(attacker)
    runs.append(run)
    kind = Processes()
    found = [r for r in kind.scan().resources if r.owner == run.owner]
    (outcome,) = kind.reap(run.owner, found, dry_run=False)
    assert outcome.refused and "is alive" in outcome.detail
    assert not run.leftover.ended()


def test_dry_run_kills_nothing(attacker, runs):
    def case() -> None:
        run = FakeRun(attacker)
        runs.append(run)
        kind = Processes()
        found = [r for r in kind.scan().resources if r.owner == run.owner]
        run.kill()
        (outcome,) = _reap(kind, run.owner, found, run.leftover, dry_run=True)
        assert outcome.ok and outcome.detail == "would kill"
        _unspoilt(run.leftover)

    _contested(case)


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
        (outcome,) = kind.reap(run.owner, [_resource(run.owner, Proc(pid))], dry_run=False)
        assert outcome.refused and "pid 1, a kernel thread or the agent" in outcome.detail


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
    return os.environ | {ENV_OWNER: str(owner), ENV_RUN: str(owner)}


def test_a_runs_leftovers_are_killed_together(attacker, runs):
    def case() -> None:
        run = FakeRun(attacker)
        runs.append(run)
        kind = Processes()
        kind.scan()  # learns the run's uid
        more = [_orphan(_as(attacker, "sleep", "1000000"), _carrying(run.owner)) for _ in range(3)]
        run.kill()
        try:
            found = [r for r in kind.scan().resources if r.owner == run.owner]
            _unspoilt(run.leftover, *more)
            assert len(found) == 4
            outcomes = _reap(kind, run.owner, found, run.leftover, *more)
            assert [o.detail for o in outcomes] == ["killed (SIGKILL)"] * 4
            assert all(p.ended() for p in [run.leftover, *more])
        finally:
            for proc in more:
                proc.kill()

    _contested(case)


def _dead_run_known(user, runs: list[FakeRun]) -> tuple[Processes, FakeRun]:
    """A kind that saw `user`'s run alive (so it knows the run's uid), and the run, dead."""
    run = FakeRun(user)
    runs.append(run)
    kind = Processes()
    kind.scan()
    run.kill()
    return kind, run


def _judged(kind: Processes, owner: Owner, proc: Proc) -> str:
    (outcome,) = _reap(kind, owner, [_resource(owner, proc)], proc)
    _unspoilt(proc)  # a refusal kills nothing
    assert outcome.refused, outcome
    return outcome.detail


def test_an_environment_read_empty_is_a_failure_to_retry_not_a_refusal(attacker, runs, monkeypatch):
    def case() -> None:
        kind, run = _dead_run_known(attacker, runs)
        res = _resource(run.owner, run.leftover)
        read = psutil.Process.environ
        monkeypatch.setattr(psutil.Process, "environ", lambda self: {})  # caught mid-exec
        (outcome,) = _reap(kind, run.owner, [res], run.leftover)
        _unspoilt(run.leftover)
        assert not outcome.ok and not outcome.refused and "reads empty" in outcome.detail
        monkeypatch.setattr(psutil.Process, "environ", read)  # the retry, once the exec is done
        (outcome,) = _reap(kind, run.owner, [res], run.leftover)
        assert outcome.ok and outcome.detail == "killed (SIGKILL)"

    _contested(case)


def test_the_agents_own_descendant_is_refused(attacker, runs):
    def case() -> None:
        kind, run = _dead_run_known(attacker, runs)
        child = subprocess.Popen(_as(attacker, "sleep", "1000000"), env=_carrying(run.owner))
        try:
            wait_for(lambda: procfs.read_stat(child.pid).comm == "sleep", what="the exec")
            detail = _judged(kind, run.owner, Proc(child.pid))
            assert "the agent's own descendant" in detail
        finally:
            child.kill()
            child.wait()

    _contested(case)


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
    _contested(lambda: _reused_pid_case(attacker))


def _reused_pid_case(attacker) -> None:
    wrapper = subprocess.Popen(_as(attacker, "sleep", "1000000"))
    owner = owner_of(wrapper.pid)
    env = os.environ | {ENV_OWNER: str(owner), ENV_RUN: str(owner)}
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
        (outcome,) = kind.reap(owner, [res], dry_run=False)
        assert outcome.ok and outcome.detail == "already gone"
        if successor.poll() is not None:  # it carries the dead run's owner, as a leftover
            raise _Spoilt(f"the successor at pid {successor.pid} was killed")
    finally:
        successor.kill()
        successor.wait()
