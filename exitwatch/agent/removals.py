"""The removal jobs of dead owners, one per owner and kind (or, for a kind with lanes, one
per resource): running on a thread pool, queued for a slot in their lane, waiting to retry
with backoff, or given up (shown in status until the resource is gone).

Only the agent's loop thread calls these. A job's end comes back to it as a Done item
through `post`, so this state needs no lock either.
"""

from __future__ import annotations

import collections
import concurrent.futures
import heapq
import itertools
import logging
import time
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace

from exitwatch.agent.record import Recorder
from exitwatch.agent.settings import Settings
from exitwatch.kinds.base import Outcome, Resource, ResourceKind
from exitwatch.owner import Owner

log = logging.getLogger(__name__)

Key = tuple[str, str]  # (kind, key) of one resource
START_AGAIN = 1.0  # seconds before a removal whose thread could not be started is started
Lane = tuple[str, Hashable]  # (kind, the kind's lane of a resource)
BUSY_PAUSE_MAX = 30.0  # seconds between looks at a resource another process is at


def retry_delay(attempt: int) -> float:
    """Seconds before the attempt after `attempt` (1, 2, ...): 0.5 s, 2 s, 8 s, ... A
    removal that failed at once (a busy engine) is soon tried again; one that keeps
    failing (an immutable file) costs ever less.

    An attempt is one run of a job, up to reap_attempts in all. Within one, a kind may try
    a step more than once: the docker kind sends each engine call up to 3 times
    (kinds/docker/attempts.py, ATTEMPTS), and says so in its failure ("after 3 tries")."""
    return 0.5 * 4 ** (attempt - 1)


def busy_delay(waited: float) -> float:
    """Seconds before a busy resource (Outcome.later) is tried again, once it has waited
    `waited` seconds: half a second at first, then as long again as it has waited, at
    most BUSY_PAUSE_MAX. It costs no attempt, and no worker while it waits."""
    return min(max(0.5, waited), BUSY_PAUSE_MAX)


@dataclass(frozen=True)
class Job:
    """Remove what one dead owner held of one kind."""

    owner: Owner
    kind: ResourceKind
    resources: tuple[Resource, ...]
    death: str
    at: float  # monotonic time the death was first noticed
    attempt: int = 1
    lane: Hashable = None  # its resource's lane, for a kind with lanes
    # Monotonic time it was first found busy: a job may stay busy for its kind's busy_wait
    # in all, and once past it each busy look is a failed attempt at once (so a lock held
    # for ever costs one busy_wait and the retries, not one busy_wait per attempt).
    busy_since: float | None = None


@dataclass(frozen=True)
class Pending:
    """A job as status shows it: running, waiting to retry, or given up."""

    job: Job
    state: str  # "removing", "waiting for a slot", "waiting to retry", "given up"
    due: float | None = None  # monotonic time of its next attempt, while it waits


@dataclass(frozen=True)
class Done:
    """A job has ended; what `failed` holds is to be tried again ((): all went well), and
    what `busy` holds too, without spending an attempt."""

    token: int
    job: Job
    failed: tuple[Resource, ...]
    busy: tuple[Resource, ...] = ()


class Removals:
    """Every removal job, from its start to its end or its last attempt."""

    def __init__(
        self, settings: Settings, recorder: Recorder, post: Callable[[Done], None]
    ) -> None:
        self._settings, self._recorder, self._post = settings, recorder, post
        self._pool = ThreadPoolExecutor(settings.reap_workers, thread_name_prefix="exitwatch-reap")
        self._running: dict[int, tuple[Future, Job]] = {}
        self._retries: list[tuple[float, int, Job]] = []
        self._tiebreak = itertools.count()
        self._removing: set[Key] = set()  # every resource of a job under way
        self._given_up: dict[Key, Job] = {}
        self._in_lane: collections.Counter[Lane] = collections.Counter()  # jobs submitted
        self._queued: dict[Lane, collections.deque[Job]] = {}  # waiting for a slot

    def start(
        self,
        owner: Owner,
        kinds: Mapping[str, ResourceKind],
        held: Iterable[Resource],
        how: str,
        at: float,
    ) -> None:
        """Remove what dead `owner` held, one job per kind, or per resource of a kind with
        lanes. A resource seen again (a fresh listing) while its removal is under way is
        skipped: one job is enough."""
        by_kind: dict[str, list[Resource]] = {}
        for res in held:
            if (res.kind, res.key) in self._removing:
                continue
            self._removing.add((res.kind, res.key))
            by_kind.setdefault(res.kind, []).append(res)
        for name, resources in by_kind.items():
            kind = kinds[name]
            if kind.lane_limit:
                for res in resources:
                    self._start(Job(owner, kind, (res,), how, at, lane=kind.lane(res)))
            else:
                self._start(Job(owner, kind, tuple(resources), how, at))

    def under_way(self, key: Key) -> bool:
        return key in self._removing

    def busy(self) -> bool:
        """Whether a job is running, queued for its lane, or waiting to retry."""
        return bool(self._running or self._retries or self._queued)

    def next_due(self) -> float | None:
        """The monotonic time the next retry is due, if one waits."""
        return self._retries[0][0] if self._retries else None

    def start_due(self, now: float) -> None:
        while self._retries and self._retries[0][0] <= now:
            self._start(heapq.heappop(self._retries)[2])

    def finished(self, done: Done) -> list[Resource]:
        """Take a job's end: what failed is tried again, or given up after the last attempt.
        Returns the resources done with (gone, or refused)."""
        del self._running[done.token]
        job = done.job
        self._leave_lane(job)
        ended = [r for r in job.resources if r not in done.failed and r not in done.busy]
        self._removing.difference_update((r.kind, r.key) for r in ended)
        failed = replace(job, resources=done.failed)
        if not (done.failed and self._retry(failed)):
            self._removing.difference_update((r.kind, r.key) for r in done.failed)
        if done.busy:
            now = time.monotonic()
            since = now if job.busy_since is None else job.busy_since
            again = replace(job, resources=done.busy, busy_since=since)
            heapq.heappush(
                self._retries, (now + busy_delay(now - since), next(self._tiebreak), again)
            )
        return ended

    def forget(self, key: Key) -> None:
        """A resource was seen again or went: it is no longer shown as given up."""
        self._given_up.pop(key, None)

    def forget_missing(
        self, kind: str, present: Iterable[str], covers: Callable[[str], bool] = lambda key: True
    ) -> None:
        """What was given up of `kind`, is within what a listing `covers` (Snapshot.covers)
        and is not among the keys `present` any more (removed by hand, or by a retry of its
        whole job) is not shown as given up for ever. `present` is read only when something
        of `kind` was given up: it may be a listing of 100,000 workdirs."""
        stale = [k for k in self._given_up if k[0] == kind and covers(k[1])]
        if stale:
            keys = set(present)
            for k in stale:
                if k[1] not in keys:
                    del self._given_up[k]

    def drain(self, timeout: float) -> int:
        """Wait up to `timeout` for the jobs running; how many were still running.

        Removals are idempotent, so one abandoned here is redone by the next reconcile.
        """
        futures = [future for future, _ in self._running.values()]
        return len(concurrent.futures.wait(futures, timeout).not_done)

    def shutdown(self, wait: bool) -> None:
        """Let the pool go; without `wait`, what has not started is cancelled."""
        self._pool.shutdown(wait=wait, cancel_futures=not wait)

    def jobs(self) -> Sequence[Job]:
        """The jobs running, queued for their lane, or waiting to retry."""
        queued = [job for jobs in self._queued.values() for job in jobs]
        return (
            [job for _, job in self._running.values()] + queued + [j for _, _, j in self._retries]
        )

    def pending(self) -> list[Pending]:
        items = [Pending(job, "removing") for _, job in self._running.values()]
        items += [Pending(job, "waiting for a slot") for q in self._queued.values() for job in q]
        items += [Pending(job, "waiting to retry", due) for due, _, job in sorted(self._retries)]
        given_up = {id(job): job for job in self._given_up.values()}
        items += [Pending(job, "given up") for job in given_up.values()]
        return items

    def _start(self, job: Job) -> None:
        if job.kind.lane_limit:
            lane = (job.kind.kind, job.lane)
            if self._in_lane[lane] >= job.kind.lane_limit:
                self._queued.setdefault(lane, collections.deque()).append(job)
                return
            self._in_lane[lane] += 1
        token = next(self._tiebreak)
        pool = job.kind.executor or self._pool
        try:
            future = pool.submit(self._reap, token, job)
        except RuntimeError as err:  # no thread can be started now (a pids limit, say)
            # Says nothing of the removal: it stays under way, and is started again soon,
            # with no attempt spent on it.
            log.warning(
                "cannot start the removal of %s now: %s; again in %g s", job.owner, err, START_AGAIN
            )
            if job.kind.lane_limit:
                self._in_lane[(job.kind.kind, job.lane)] -= 1
            heapq.heappush(self._retries, (time.monotonic() + START_AGAIN, token, job))
            return
        self._running[token] = (future, job)

    def _leave_lane(self, job: Job) -> None:
        """A job of a kind with lanes has ended: the next queued in its lane starts."""
        if not job.kind.lane_limit:
            return
        lane = (job.kind.kind, job.lane)
        self._in_lane[lane] -= 1
        if not self._in_lane[lane]:
            del self._in_lane[lane]
        queued = self._queued.get(lane)
        if queued:
            upcoming = queued.popleft()
            if not queued:
                del self._queued[lane]
            self._start(upcoming)

    def _retry(self, job: Job) -> bool:
        """Schedule the job's next attempt; False once it has had them all (reap_attempts;
        the tries within each attempt are its kind's, see retry_delay)."""
        if job.attempt < self._settings.reap_attempts:
            due = time.monotonic() + retry_delay(job.attempt)
            retry = replace(job, attempt=job.attempt + 1)
            heapq.heappush(self._retries, (due, next(self._tiebreak), retry))
            return True
        self._recorder.count("gave_up")
        self._given_up.update(((r.kind, r.key), job) for r in job.resources)
        log.error(
            "giving up on the %ss of %s after %d attempts (reap_attempts; the tries within "
            "each are its kind's); the next reconcile, start or `exitwatch reap` tries again",
            job.kind.kind,
            job.owner,
            job.attempt,
        )
        return False

    def _reap(self, token: int, job: Job) -> None:
        dry_run = self._settings.dry_run
        try:
            outcomes = job.kind.reap(job.owner, list(job.resources), dry_run, job.death)
        except Exception as err:  # a kind must not raise; if it does, report and retry
            log.exception("removing %s of %s failed", job.kind.kind, job.owner)
            what = f"{job.kind.kind}s of {job.owner}"
            outcomes = [Outcome.failed(what, job.kind.kind, str(err))]
        now = time.monotonic()
        waited = 0.0 if job.busy_since is None else now - job.busy_since
        if waited >= job.kind.busy_wait:
            # Held for longer than another process may rightly hold it: a failed attempt.
            outcomes = [
                replace(o, busy=False, detail=f"{o.detail}, for {waited:.0f} s") if o.busy else o
                for o in outcomes
            ]
        for outcome in outcomes:
            if outcome.busy:  # nothing was done: nothing to record yet
                log.debug("%s: %s; looking again", outcome.what, outcome.detail)
            else:
                self._recorder.outcome(job.owner, job.death, outcome, now - job.at, dry_run)
        failed = [o for o in outcomes if not o.ok and not o.refused and not o.busy]
        busy = [o for o in outcomes if o.busy]
        self._post(Done(token, job, _which(job, failed), _which(job, busy)))


def _which(job: Job, outcomes: Sequence[Outcome]) -> tuple[Resource, ...]:
    """The resources of `job` that `outcomes` are about: each outcome says which resource
    it is, or, saying none, it is about them all."""
    keys = {o.key for o in outcomes}
    if "" in keys:
        return job.resources
    return tuple(r for r in job.resources if r.key in keys)
