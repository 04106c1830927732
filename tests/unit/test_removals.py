"""The removal jobs (agent/removals.py): the retry schedule (the backoff starts at half a
second and quadruples, and a failed job's next attempt is due that long after its end,
until the last attempt gives it up), lanes (a full lane's jobs wait as data, holding no
worker), and busy resources (looked at again without spending an attempt)."""

from __future__ import annotations

import errno
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from exitwatch import procfs
from exitwatch.agent.record import Recorder
from exitwatch.agent.removals import Removals, busy_delay, retry_delay
from exitwatch.kinds.base import Outcome, Resource, ResourceKind, Snapshot

from support.procs import wait_for
from support.things import DEAD, Things, thing


@dataclass(frozen=True)
class Settings:
    dry_run: bool = False
    reap_workers: int = 1
    reap_attempts: int = 3
    reconcile_interval: float = 0.0


def test_the_backoff_starts_at_half_a_second_and_quadruples():
    assert [retry_delay(attempt) for attempt in (1, 2, 3)] == [0.5, 2.0, 8.0]


def test_a_busy_resource_is_looked_at_again_as_long_as_it_waited_up_to_half_a_minute():
    assert [busy_delay(w) for w in (0, 0.5, 1, 2, 20, 3600)] == [0.5, 0.5, 1, 2, 20, 30]


def test_a_failed_job_is_due_again_after_its_attempts_delay_then_given_up(caplog):
    ended: queue.SimpleQueue = queue.SimpleQueue()
    recorder = Recorder()
    jobs = Removals(Settings(), recorder, ended.put)
    try:
        jobs.start(DEAD, {"thing": Things(fail=True)}, [thing("stuck")], "killed", 0.0)
        for delay in (0.5, 2.0):  # after attempts 1 and 2 of 3
            done = ended.get(timeout=10)
            before = time.monotonic()
            jobs.finished(done)
            after = time.monotonic()
            due = jobs.next_due()
            assert due is not None and before + delay <= due <= after + delay
            [waiting] = jobs.pending()
            assert waiting.state == "waiting to retry"
            jobs.start_due(due)  # its time, as the agent's loop would see it then
        jobs.finished(ended.get(timeout=10))
        assert jobs.next_due() is None and not jobs.busy()
        assert recorder.counters()["gave_up"] == 1
        [given_up] = jobs.pending()
        assert (given_up.state, given_up.job.attempt) == ("given up", 3)
        # The figure names its layer: the agent's attempts, not its kind's tries in each.
        assert (
            f"giving up on the things of {DEAD} after 3 attempts (reap_attempts; the tries "
            "within each are its kind's)" in caplog.text
        )
    finally:
        jobs.shutdown(wait=True)


class Laned(ResourceKind):
    """A kind with lanes (the part of a key before "-"), on a pool of its own of `workers`
    threads; each removal holds until its key's event is set, and says busy while the key
    is in `busy`."""

    kind = "laned"

    def __init__(self, limit: int, workers: int, busy_wait: float = 0.0) -> None:
        self.lane_limit, self.busy_wait = limit, busy_wait
        self.executor = ThreadPoolExecutor(workers)
        self.go: dict[str, threading.Event] = {}
        self.running: set[str] = set()
        self.busy: set[str] = set()
        self.calls: list[str] = []
        self._lock = threading.Lock()

    def lane(self, res: Resource) -> str:
        return res.key.split("-")[0]

    def remove(self, owner, resources, dry_run, how) -> list[Outcome]:
        [res] = resources  # one per job, in a kind with lanes
        with self._lock:
            self.calls.append(res.key)
            if res.key in self.busy:
                return [Outcome.later(f"laned {res.key}", self.kind, "locked", key=res.key)]
            self.running.add(res.key)
        self.go.setdefault(res.key, threading.Event()).wait(10)
        with self._lock:
            self.running.discard(res.key)
        return [Outcome.done(f"laned {res.key}", self.kind, key=res.key)]

    def scan(self) -> Snapshot:
        return Snapshot(self.kind, ())

    def start(self, notify) -> None:
        pass

    def stop(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)


def laned(key: str) -> Resource:
    return Resource("laned", key, DEAD, key)


def test_a_full_lane_queues_its_jobs_as_data_and_the_other_lanes_run():
    """One user's many removals (lane "a", limit 2) on a pool of 3: two run, the rest wait
    in the agent's queue holding no worker, so lane "b"'s starts at once."""
    ended: queue.SimpleQueue = queue.SimpleQueue()
    kind = Laned(limit=2, workers=3)
    jobs = Removals(Settings(), Recorder(), ended.put)
    try:
        jobs.start(DEAD, {"laned": kind}, [laned(f"a-{n}") for n in range(5)], "killed", 0.0)
        jobs.start(DEAD, {"laned": kind}, [laned("b-0")], "killed", 0.0)
        wait_for(lambda: len(kind.running) == 3, 10, "three removals running")
        assert kind.running == {"a-0", "a-1", "b-0"}
        states = sorted(p.state for p in jobs.pending())
        assert states == ["removing"] * 3 + ["waiting for a slot"] * 3
        assert len(jobs.jobs()) == 6 and jobs.busy()
        kind.go.setdefault("a-0", threading.Event()).set()
        jobs.finished(ended.get(timeout=10))
        wait_for(lambda: "a-2" in kind.running, 10, "the next of lane a to start")
        assert len(kind.running & {"a-1", "a-2", "a-3", "a-4"}) == 2
        for key in ("b-0", "a-1", "a-2", "a-3", "a-4"):
            kind.go.setdefault(key, threading.Event()).set()
        while jobs.busy():
            jobs.finished(ended.get(timeout=10))
        assert sorted(kind.calls) == ["a-0", "a-1", "a-2", "a-3", "a-4", "b-0"]
    finally:
        for event in kind.go.values():
            event.set()
        jobs.shutdown(wait=True)
        kind.stop()


def test_a_busy_resource_is_looked_at_again_without_spending_an_attempt_then_fails():
    """Outcome.later: tried again half a second on, at the same attempt, holding no slot
    of its lane meanwhile; once busy for longer than the kind's busy_wait, it counts as
    a failed attempt, and so does each busy look after that: it is given up after its
    attempts' delays, not after busy_wait again for each."""
    ended: queue.SimpleQueue = queue.SimpleQueue()
    kind = Laned(limit=1, workers=2, busy_wait=1.0)
    kind.busy.add("a-0")
    kind.go["a-1"] = threading.Event()
    kind.go["a-1"].set()
    recorder = Recorder()
    jobs = Removals(Settings(), recorder, ended.put)
    try:
        jobs.start(DEAD, {"laned": kind}, [laned("a-0"), laned("a-1")], "killed", 0.0)
        jobs.finished(ended.get(timeout=10))  # a-0: busy; a-1 takes the lane
        [waiting] = [p for p in jobs.pending() if p.state == "waiting to retry"]
        assert waiting.job.attempt == 1 and waiting.job.busy_since is not None
        assert waiting.due is not None and waiting.due - time.monotonic() <= 0.5
        assert jobs.finished(ended.get(timeout=10)) == [laned("a-1")]
        tries = 1
        while recorder.counters().get("removal_errors", 0) == 0:
            due = jobs.next_due()
            assert due is not None
            time.sleep(max(0.0, due - time.monotonic()))
            jobs.start_due(time.monotonic())
            jobs.finished(ended.get(timeout=10))
            tries += 1
        # Busy at 0, 0.5 and 1 s: the look past busy_wait is a failed attempt, the first.
        assert tries == 3 and kind.calls.count("a-0") == 3
        [retry] = [p for p in jobs.pending() if p.state == "waiting to retry"]
        assert retry.job.attempt == 2
        [reap] = recorder.reaps()[-1:]
        assert not reap.ok and reap.result.startswith("locked, for ")
        for _ in (2, 3):  # attempts 2 and 3, 0.5 s and 2 s on: busy, so failed at once
            due = jobs.next_due()
            assert due is not None
            time.sleep(max(0.0, due - time.monotonic()))
            jobs.start_due(time.monotonic())
            jobs.finished(ended.get(timeout=10))
        assert not jobs.busy() and recorder.counters()["gave_up"] == 1
        assert kind.calls.count("a-0") == 5
    finally:
        jobs.shutdown(wait=True)
        kind.stop()


class _NoThreadOnce(ThreadPoolExecutor):
    """A pool that cannot start a thread the first time, as under a pids limit."""

    def __init__(self) -> None:
        super().__init__(1)
        self.refused = 0

    def submit(self, fn, /, *args, **kwargs):
        if not self.refused:
            self.refused += 1
            raise RuntimeError("can't start new thread")
        return super().submit(fn, *args, **kwargs)


def test_a_job_whose_thread_cannot_be_started_stays_under_way_and_starts_later():
    ended: queue.SimpleQueue = queue.SimpleQueue()
    kind = Things()
    kind.executor = _NoThreadOnce()
    jobs = Removals(Settings(), Recorder(), ended.put)
    try:
        jobs.start(DEAD, {"thing": kind}, [thing("x")], "killed", 0.0)
        assert kind.executor.refused == 1 and kind.calls == []
        assert jobs.under_way(("thing", "x")) and jobs.busy()
        due = jobs.next_due()
        assert due is not None
        jobs.start_due(due)
        done = ended.get(timeout=10)
        assert done.job.attempt == 1  # no attempt spent on a thread that did not start
        assert jobs.finished(done) == [thing("x")] and not jobs.under_way(("thing", "x"))
        assert kind.calls == [["x"]]
    finally:
        jobs.shutdown(wait=True)
        kind.executor.shutdown(wait=True)


def test_an_owner_that_cannot_be_judged_now_fails_the_attempt_and_nothing_is_removed(
    monkeypatch,
):
    """A full fd table (EMFILE) while the kind checks its owner once more before removing:
    one failed outcome per resource, tried again later; never an exception, never a removal."""

    def unreadable(pid: int):
        raise OSError(errno.EMFILE, "Too many open files", f"/proc/{pid}/stat")

    monkeypatch.setattr(procfs, "read_stat", unreadable)
    kind = Things()
    outcomes = kind.reap(DEAD, [thing("a"), thing("b")], dry_run=False)
    assert kind.calls == []
    assert [(o.ok, o.refused, o.key) for o in outcomes] == [(False, False, k) for k in "ab"]
    assert outcomes[0].detail == f"cannot tell whether its owner {DEAD} lives: Too many open files"
