"""The removal jobs' retry schedule (agent/removals.py): the backoff starts at half a
second and quadruples, and a failed job's next attempt is due that long after its end,
until the last attempt gives it up."""

from __future__ import annotations

import queue
import time
from dataclasses import dataclass

from exitwatch.agent.record import Recorder
from exitwatch.agent.removals import Removals, retry_delay

from support.things import DEAD, Things, thing


@dataclass(frozen=True)
class Settings:
    dry_run: bool = False
    reap_workers: int = 1
    reap_attempts: int = 3
    reconcile_interval: float = 0.0


def test_the_backoff_starts_at_half_a_second_and_quadruples():
    assert [retry_delay(attempt) for attempt in (1, 2, 3)] == [0.5, 2.0, 8.0]


def test_a_failed_job_is_due_again_after_its_attempts_delay_then_given_up():
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
    finally:
        jobs.shutdown(wait=True)
