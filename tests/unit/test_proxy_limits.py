"""The proxy's bounds (proxy/limits.py) and its workers (proxy/relay.Workers) when a thread
cannot be started: engine/test_adopt_limits.py has them under a real pids cgroup and a
real descriptor limit."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from exitwatch.proxy import limits
from exitwatch.proxy.relay import Workers


def test_a_worker_that_cannot_start_queues_nothing_and_leaves_the_spare_count_right(
    monkeypatch,
) -> None:
    workers = Workers()
    ran = threading.Event()
    real = threading.Thread.start

    def refused(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", refused)
    with pytest.raises(RuntimeError):
        workers.submit(ran.set)
    monkeypatch.setattr(threading.Thread, "start", real)
    assert workers._idle == 0 and workers._tasks.empty()
    workers.submit(ran.set)  # a new worker, not a spare one that does not exist
    assert ran.wait(10)
    workers.close()


def _tree(tmp_path: Path, lines: str, maxes: dict[str, str]) -> tuple[str, str]:
    (tmp_path / "cgroup").write_text(lines)
    for where, value in maxes.items():
        d = tmp_path / "fs" / where
        d.mkdir(parents=True, exist_ok=True)
        (d / "pids.max").write_text(value + "\n")
    return str(tmp_path / "cgroup"), str(tmp_path / "fs")


def test_the_lowest_pids_max_of_the_cgroup_and_its_ancestors(tmp_path) -> None:
    v1 = "8:pids:/a/b\n0::/\n"
    args = _tree(tmp_path, v1, {"pids/a": "50", "pids/a/b": "max", "pids": "max"})
    assert limits.tasks_max(*args) == 50
    v2 = "0::/system.slice/x.service\n"
    args = _tree(tmp_path, v2, {"system.slice/x.service": "4200"})
    assert limits.tasks_max(*args) == 4200
    assert limits.tasks_max(*_tree(tmp_path, "0::/\n", {})) is None


def test_a_client_holds_its_share_and_the_total_is_held() -> None:
    gate = limits.Gate(limits.Limits(total=3, per_client=2, why="test"))
    assert gate.enter() and gate.enter() and gate.enter() and not gate.enter()
    assert gate.claim("a") and gate.claim("a") and not gate.claim("a") and gate.claim("b")
    gate.unclaim("a")
    gate.leave()
    assert gate.claim("a") and gate.enter()
