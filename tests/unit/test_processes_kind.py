"""The process kind's loop and setting on their own: a rescan that fails is tried again
and shown in health, kill_leftovers = false means no process kind, and a process too new
for the rescan to have seen is no miss of a reconcile's."""

from __future__ import annotations

import os
import subprocess
import threading

from exitwatch.agent.loop import Agent
from exitwatch.contract import ENV_OWNER, ENV_RUN
from exitwatch.kinds.base import Resource, Snapshot
from exitwatch.kinds.processes.kind import KIND, Processes
from exitwatch.owner import owner_of
from exitwatch.service.config import Config
from exitwatch.service.daemon import make_kinds

from support.procs import wait_for


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
    assert isinstance(make_kinds(Config())[KIND], Processes)
    assert KIND not in make_kinds(Config().updated({"kill_leftovers": False}))


def _carrier() -> subprocess.Popen:
    """A child of this process carrying this (live) process as its run's owner."""
    me = str(owner_of())
    return subprocess.Popen(["sleep", "60"], env=os.environ | {ENV_OWNER: me, ENV_RUN: me})


def test_a_process_younger_than_a_full_rescan_is_not_overdue():
    kind = Processes(interval=0.1)
    child = _carrier()
    try:
        res = Resource(KIND, f"{child.pid}:{owner_of(child.pid).starttime}", owner_of())
        assert not kind.overdue(res)
        wait_for(lambda: kind.overdue(res), timeout=10, what="the process to be overdue")
    finally:
        child.kill()
        child.wait()


def test_a_reconcile_that_lists_a_process_before_the_rescan_counts_no_miss():
    """The watcher rescans every 5 s, the reconcile runs every second: a run's process
    that just started is listed by a reconcile first, and was not missed (found by the
    soak: every periodic reconcile of a host with runs counted some)."""
    agent = Agent(Config(reconcile_interval=1), [Processes(interval=5.0)])
    thread = threading.Thread(target=agent.run)
    thread.start()
    child = None
    try:
        wait_for(lambda: agent.counters()["reconciles"] >= 1, what="the start-up listing")
        child = _carrier()
        me, pid = owner_of(), child.pid

        def held() -> bool:  # asked on the agent's loop thread
            return any(r.key.startswith(f"{pid}:") for r in agent.index.resources(me))

        wait_for(lambda: agent.ask(held), timeout=4, what="a reconcile to take the process in")
        assert agent.counters()["reconcile_missed"] == 0
    finally:
        if child is not None:
            child.kill()
            child.wait()
        agent.stop()
        thread.join(10)
