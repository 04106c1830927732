"""The process kind in a real agent with the private engine: a dead run's leftovers are
killed once the agent sees the run's wrapper die, and nobody else's are (a shell that
exported the owner alone, another user's process carrying a root run's owner).
system/test_processes.py drives the kind itself."""

from __future__ import annotations

import json
from pathlib import Path

from exitwatch.kinds.processes.kind import KIND

from support.agentproc import Agent, running
from support.procs import wait_for
from support.runs import CONTESTED_TRIES, WRAPPER, FakeRun, Proc, other_agents

# A shell that ran `eval "$(exitwatch labels --format env)"`: the owner alone, no run.
_SHELL = WRAPPER.replace('EXITWATCH_RUN="$owner" ', "")
DEADLINE = 30.0  # for a correct agent on a loaded machine, not a measure of its speed


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


def _entry(agent: Agent, proc: Proc, refused: bool = False) -> dict | None:
    for reap in _audit(agent):
        mine = reap["kind"] == KIND and f"process {proc.pid} " in reap["what"]
        if mine and reap["refused"] == refused:
            return reap
    return None


def _recorded(agent: Agent, proc: Proc, refused: bool = False) -> dict:
    return wait_for(
        lambda: _entry(agent, proc, refused),
        timeout=DEADLINE,
        what=f"the audit entry of process {proc.pid}",
    )


def _beaten(agent: Agent, entry: dict | None) -> bool:
    """Whether another agent on the host may have killed the leftover first: this agent
    then found it gone (or, for one that lived less than a rescan, never saw it). Only
    with another agent there: else it is this agent's failure."""
    if entry is not None and entry["result"] == "killed (SIGKILL)":
        return False
    others = other_agents(but=agent.pid)
    assert others and (entry is None or entry["result"] == "already gone"), (entry, others)
    return True


def test_dead_runs_leftovers_are_killed_and_nobody_elses(
    engine, workroot, tmp_path, attacker, runs
):
    with running(engine, workroot, tmp_path / "agent.log", leftovers=True) as agent:
        # Another agent with the process kind (a real one, another session's) kills the
        # same leftovers, and may be first: then the case is made again, a few times, and
        # this agent must kill one itself.
        for _ in range(CONTESTED_TRIES):
            dead, live = FakeRun(attacker), FakeRun(attacker)
            runs += [dead, live]
            # Carrying the dead run's owner: a root process (the variable kept through
            # sudo) and a process of the live run's user that is no descendant of the run.
            rooted = dead.carrier()
            _holding(agent, dead, 2)
            _holding(agent, live, 1)

            dead.kill()
            wait_for(dead.leftover.ended, timeout=DEADLINE, what="the leftover killed")
            killed = _recorded(agent, dead.leftover)
            assert killed["ok"], killed
            if not _beaten(agent, killed):
                break
        else:
            raise AssertionError(f"other agents killed all {CONTESTED_TRIES} leftovers first")
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
        for _ in range(CONTESTED_TRIES):
            late = dead.carrier(attacker)
            wait_for(late.ended, timeout=DEADLINE, what="the late leftover killed")
            try:  # a few rescans: one that never saw it (killed by another) records nothing
                entry = wait_for(lambda p=late: _entry(agent, p), timeout=5, what="its record")
            except AssertionError:
                entry = None
            if not _beaten(agent, entry):
                break
        else:
            raise AssertionError(f"other agents killed all {CONTESTED_TRIES} late leftovers first")

        assert not live.leftover.ended()
        _holding(agent, live, 1)
        rescans = agent.status()["processes"]
        assert rescans["rescans"] > 0 and rescans["failing"] == 0
        shown = [r for r in agent.status()["reaps"] if r["kind"] == KIND and r["ok"]]
        assert {r["what"].split()[1] for r in shown} >= {str(dead.leftover.pid), str(late.pid)}


def test_a_shell_that_exported_only_the_owner_leaves_its_jobs_alive(
    engine, workroot, tmp_path, attacker, runs
):
    with running(engine, workroot, tmp_path / "agent.log", leftovers=True) as agent:
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


def test_anothers_process_carrying_a_root_runs_owner_is_left(
    engine, workroot, tmp_path, attacker, runs
):
    with running(engine, workroot, tmp_path / "agent.log", leftovers=True) as agent:
        run = FakeRun()
        runs.append(run)
        planted = run.carrier(attacker)
        _holding(agent, run, 2)
        run.kill()
        wait_for(run.leftover.ended, timeout=DEADLINE, what="the root run's leftover killed")
        refused = _recorded(agent, planted, refused=True)
        assert "are not the run's uid 0" in refused["result"]
        assert not planted.ended()
