"""The process kind in a real agent with the private engine: a dead run's leftovers are
killed once the agent sees the run's wrapper die, and nobody else's are (a shell that
exported the owner alone, another user's process carrying a root run's owner).
system/test_processes.py drives the kind itself."""

from __future__ import annotations

import json
import os
import re
import signal
import tempfile
from pathlib import Path

from exitwatch.contract import mark_workdir
from exitwatch.kinds.processes.kind import KIND
from exitwatch.service.status.text import render

from support.agentproc import Agent, agent_argv, free_port, running, scrape
from support.packaging import bounding_set
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


# -- The packaged unit's capabilities --------------------------------------------------------


def _held_to(bounding: str, engine, workroot: Path, log: Path, *extra: str) -> Agent:
    """An agent with the process kind, run as root within the capability bounding set
    `bounding` (setpriv, as systemd's CapabilityBoundingSet= does), ready."""
    argv = agent_argv("netlink", engine.host, workroot, extra=extra, leftovers=True)
    agent = Agent(["setpriv", f"--bounding-set={bounding}", "--inh-caps=-all", *argv], log)
    agent.wait_log("ready:")
    return agent


def _zombie(run: FakeRun) -> None:
    """SIGKILL the run's wrapper and leave it a zombie of this process (the runs fixture
    waits for it): its exit code is there to read, for whom may read it."""
    os.kill(run.proc.pid, signal.SIGKILL)


def test_the_units_capabilities_let_the_kind_kill_roots_and_a_users_leftovers(
    engine, workroot, tmp_path, attacker, runs
):
    """Under the packaged unit's bounding set the kind reads every process: a SIGKILLed
    run's leftovers die, root's and a user's, and its death is told as it was. Without
    CAP_SYS_PTRACE in the set, none was (the next test)."""
    agent = _held_to(bounding_set(), engine, workroot, tmp_path / "agent.log")
    try:
        for user in (None, attacker):
            for _ in range(CONTESTED_TRIES):
                run = FakeRun(user)
                runs.append(run)
                _holding(agent, run, 1)
                _zombie(run)
                wait_for(run.leftover.ended, timeout=DEADLINE, what="the leftover killed")
                killed = _recorded(agent, run.leftover)
                if not _beaten(agent, killed):
                    break
            else:
                raise AssertionError(f"other agents killed all {CONTESTED_TRIES} leftovers first")
            assert killed["ok"] and killed["death"] == "zombie, killed by SIGKILL", killed
        processes = agent.status()["processes"]
        assert processes["unreadable"] == 0 and processes["last_unreadable"] is None
        assert "blind" not in agent.text()
    finally:
        agent.stop()


def test_without_cap_sys_ptrace_the_kind_says_it_is_blind(
    engine, workroot, tmp_path, attacker, runs
):
    """The unit less CAP_SYS_PTRACE (a drop-in that took it): no process's environment can
    be read, and the agent says so once in its log, in status and in a metric, instead of
    skipping them in silence; a zombie owner's exit code reads 0 there, so how it ended is
    told as unknown, not as "exited with code 0"."""
    port = free_port()
    bounding = bounding_set(drop=("CAP_SYS_PTRACE",))
    metrics = ("--metrics-addr", f"127.0.0.1:{port}")
    agent = _held_to(bounding, engine, workroot, tmp_path / "agent.log", *metrics)
    try:
        run = FakeRun(attacker)
        runs.append(run)
        agent.wait_log("is blind to such processes")
        wait_for(lambda: agent.status()["processes"]["unreadable"] > 0, what="unreadable > 0")
        status = agent.status()
        assert status["processes"]["last_unreadable"], status["processes"]
        assert "BLIND to" in render(status)
        scraped = re.search(r"^exitwatch_processes_unreadable (\S+)$", scrape(port), re.M)
        assert scraped and float(scraped[1]) > 0, scraped
        # The owner's workdir goes; the death recorded is not a made-up exit code 0.
        workdir = Path(tempfile.mkdtemp(dir=workroot))
        mark_workdir(workdir, pid=run.proc.pid)
        agent.wait_holding(run.proc.pid, workdirs=1)
        _zombie(run)
        wait_for(lambda: not workdir.exists(), timeout=DEADLINE, what=f"{workdir} removed")
        entry = wait_for(
            lambda: next((r for r in _audit(agent) if r["owner"] == str(run.owner)), None),
            timeout=DEADLINE,
            what="the workdir's audit entry",
        )
        assert entry["death"].startswith("zombie, how it ended unknown"), entry
        # Once, however many rescans met a process it could not read.
        wait_for(lambda: agent.status()["processes"]["rescans"] > 2, what="rescans")
        assert agent.text().count("is blind to such processes") == 1, agent.text()
    finally:
        agent.stop()
