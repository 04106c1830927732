"""The periodic reconcile end to end: a real agent gives up on a workdir that the kernel's
immutable flag keeps it from emptying, and its next reconcile removes the workdir once
the flag is cleared."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from exitwatch import mark_workdir

from support.agentproc import Agent, agent_argv, wait_gone
from support.procs import kill, spawn_owner, wait_for


def _chattr(flag: str, path: Path) -> None:
    subprocess.run(["chattr", flag, str(path)], check=True, capture_output=True)


def test_a_given_up_workdir_is_removed_by_the_next_reconcile(engine, workroot, tmp_path):
    owner = spawn_owner()
    path = workroot / "stuck"
    (path / "sub").mkdir(parents=True)
    pinned = path / "sub" / "pinned"
    pinned.write_text("immutable until the test says")
    mark_workdir(path, owner.pid)
    _chattr("+i", pinned)
    argv = agent_argv("netlink", engine.host, workroot, extra=("--reconcile-interval", "1"))
    agent = Agent(argv, tmp_path / "agent.log")
    try:
        agent.wait_log("ready:")
        agent.wait_holding(owner.pid, workdirs=1)
        kill(owner)
        wait_for(
            lambda: agent.status()["counters"]["gave_up"] >= 1,
            timeout=60,
            what="the agent to give up on the workdir",
        )
        assert path.exists()
        _chattr("-i", pinned)
        wait_gone(engine, paths=[path])
        # Counted once the removal has returned, which is after the path went.
        doc = wait_for(
            lambda: (d := agent.status())["counters"].get("reaped_workdir") and d,
            what="the removal counted",
        )
        counters = doc["counters"]
        assert counters["reconcile_missed"] >= 1, counters
        assert counters["reconciles"] >= 2, counters
        assert counters["reaped_workdir"] == 1, counters
        last = doc["reconcile"]["last"]
        assert doc["reconcile"]["interval_s"] == 1
        assert last["run"] >= 1 and not last["errors"], last
        socket = agent.flag("--status-socket")
        text = subprocess.run(
            [sys.executable, "-m", "exitwatch", "status", "--status-socket", socket],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
        assert "reconcile: every 1 s; last " in text, text
    finally:
        if pinned.exists():
            _chattr("-i", pinned)
        agent.stop()
