"""hint → confirm → reap → record. The one-shot reconcile is the same path, fed everything."""

from __future__ import annotations

import heapq
import itertools
import logging
import queue
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from exitwatch.config import Config
from exitwatch.index import Index
from exitwatch.owner import Owner, death, describe_status
from exitwatch.record import Recorder
from exitwatch.resources.base import Found, Gone, Outcome, Resource, ResourceKind, Snapshot
from exitwatch.sources.base import Exit, Lost, Source

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Job:
    """Remove what one dead owner held of one kind."""

    owner: Owner
    kind: ResourceKind
    resources: tuple[Resource, ...]
    death: str
    at: float  # monotonic time the death was first noticed
    attempt: int = 1


@dataclass(frozen=True)
class _Done:
    job: _Job
    failed: bool


_STOP = object()


class Agent:
    """Owns the index. Every input (hints, resource changes, finished removals) arrives on
    one queue and is handled by one thread, so the index needs no lock; removals run on a
    thread pool so a slow one never holds up the next death."""

    def __init__(
        self,
        config: Config,
        kinds: Sequence[ResourceKind],
        source: Source | None = None,
        recorder: Recorder | None = None,
    ) -> None:
        self.config = config
        self.kinds = {k.kind: k for k in kinds}
        self.source = source
        self.recorder = recorder or Recorder()
        self.index = Index()
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._pool = ThreadPoolExecutor(config.reap_workers, thread_name_prefix="exitwatch-reap")
        self._inflight = 0
        self._retries: list[tuple[float, int, _Job]] = []
        self._tiebreak = itertools.count()
        self._awaiting_snapshot = set(self.kinds)

    # -- inputs ---------------------------------------------------------------------------

    def submit(self, item: object) -> None:
        """Queue a hint or a resource change; callable from any thread."""
        self._queue.put(item)

    def stop(self) -> None:
        self._queue.put(_STOP)

    # -- running --------------------------------------------------------------------------

    def run(self) -> None:
        """Watch until stop() is called."""
        if self.source is not None:
            self.source.start(self.submit)
        for kind in self.kinds.values():
            kind.start(self.submit)
        try:
            while self._step(block=True):
                pass
        finally:
            for kind in self.kinds.values():
                kind.stop()
            if self.source is not None:
                self.source.stop()
            self._pool.shutdown(wait=True, cancel_futures=True)

    def reconcile(self) -> None:
        """One pass over everything that exists now: reap what dead owners hold, and wait."""
        for kind in self.kinds.values():
            self._handle(kind.scan())
        while self._inflight or self._retries:
            self._step(block=True)
        self._pool.shutdown(wait=True)

    def _step(self, block: bool) -> bool:
        timeout = None
        if self._retries:
            timeout = max(0.0, self._retries[0][0] - time.monotonic())
        try:
            item = self._queue.get(block=block, timeout=timeout)
        except queue.Empty:
            item = None
        now = time.monotonic()
        while self._retries and self._retries[0][0] <= now:
            self._start(heapq.heappop(self._retries)[2])
        if item is _STOP:
            return False
        if item is not None:
            self._handle(item)
        return True

    def _handle(self, item: object) -> None:
        match item:
            case Exit():
                self.recorder.count("exit_hints")
                self._on_exit(item)
            case Lost(reason=reason):
                self.recorder.count("resyncs")
                log.warning(
                    "exit hints lost (%s); re-checking all %d owners", reason, len(self.index)
                )
                for owner in self.index.owners():
                    self._confirm(owner, time.monotonic())
            case Found(resource=res):
                new, displaced = self.index.add(res)
                if displaced is not None:
                    self._unwatch(displaced)
                if new:
                    self._admit(res.owner)
            case Gone(kind=kind, key=key):
                emptied = self.index.discard(kind, key)
                if emptied is not None:
                    self._unwatch(emptied)
            case Snapshot(kind=kind, resources=resources):
                added, emptied = self.index.replace_kind(kind, resources)
                for owner in emptied:
                    self._unwatch(owner)
                for owner in added:
                    self._admit(owner)
                if self._awaiting_snapshot:
                    self._awaiting_snapshot.discard(kind)
                    if not self._awaiting_snapshot:
                        log.info("ready: watching %d owners", len(self.index))
            case _Done(job=job, failed=failed):
                self._inflight -= 1
                if failed and job.attempt < self.config.reap_attempts:
                    delay = 0.5 * 4 ** (job.attempt - 1)
                    due = time.monotonic() + delay
                    retry = replace(job, attempt=job.attempt + 1)
                    heapq.heappush(self._retries, (due, next(self._tiebreak), retry))

    # -- confirm --------------------------------------------------------------------------

    def _on_exit(self, hint: Exit) -> None:
        for owner in list(self.index.owners_of_pid(hint.pid)):
            # An event that carries a start time names exactly one process.
            if hint.starttime is not None and hint.starttime != owner.starttime:
                continue
            self._confirm(owner, hint.at or time.monotonic(), hint.status)

    def _admit(self, owner: Owner) -> None:
        """A new owner: watch it first, then confirm, so a death in between is not missed."""
        if self.source is not None:
            self.source.watch(owner)
        self._confirm(owner, time.monotonic())

    def _unwatch(self, owner: Owner) -> None:
        if self.source is not None:
            self.source.unwatch(owner)

    def _confirm(self, owner: Owner, at: float, status: int | None = None) -> None:
        reason = death(owner)
        if reason is None:
            return
        how = reason if status is None else f"{describe_status(status)} ({reason})"
        resources = self.index.pop_owner(owner)
        self._unwatch(owner)
        by_kind: dict[str, list[Resource]] = {}
        for res in resources:
            by_kind.setdefault(res.kind, []).append(res)
        for kind, held in by_kind.items():
            self._start(_Job(owner, self.kinds[kind], tuple(held), how, at))

    # -- reap -----------------------------------------------------------------------------

    def _start(self, job: _Job) -> None:
        self._inflight += 1
        self._pool.submit(self._reap, job)

    def _reap(self, job: _Job) -> None:
        try:
            outcomes = job.kind.remove(job.owner, list(job.resources), self.config.dry_run)
        except Exception as err:  # a kind must not raise; if it does, report and retry
            log.exception("removing %s of %s failed", job.kind.kind, job.owner)
            outcomes = [Outcome(f"{job.kind.kind}s of {job.owner}", job.kind.kind, False, str(err))]
        latency = time.monotonic() - job.at
        for outcome in outcomes:
            self.recorder.outcome(job.owner, job.death, outcome, latency, self.config.dry_run)
        failed = any(not o.ok and not o.refused for o in outcomes)
        self._queue.put(_Done(job, failed))
