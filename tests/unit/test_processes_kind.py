"""The process kind's loop and setting on their own: a rescan that fails is tried again
and shown in health, and kill_leftovers = false means no process kind."""

from __future__ import annotations

from exitwatch.kinds.base import Snapshot
from exitwatch.kinds.processes.kind import Processes
from exitwatch.kinds.processes.table import KIND
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
    assert KIND not in make_kinds(Config(kill_leftovers=False))
