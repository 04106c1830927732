"""hint → confirm → reap → record. The one-shot reconcile is the same path, fed everything."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import TypeVar

from exitwatch import shutdown
from exitwatch.agent import elsewhere
from exitwatch.agent.index import Index
from exitwatch.agent.rechecks import Rechecks
from exitwatch.agent.reconcile import RECONCILE_COUNTERS, Periodic, Scanned
from exitwatch.agent.record import Gauges, Recorder, gauges
from exitwatch.agent.removals import Done, Pending, Removals
from exitwatch.agent.settings import Settings
from exitwatch.kinds import registry
from exitwatch.kinds.base import Acted, Found, Gone, ResourceKind, Snapshot
from exitwatch.owner import Owner, death, describe_status
from exitwatch.sources.base import Exit, Lost, Source

log = logging.getLogger(__name__)
T = TypeVar("T")

ASK_TIMEOUT = 1.0  # how long a status or metrics reader waits for the loop
LOST_LOG_EVERY = 10.0  # a fork storm can overflow the buffer many times a second
RESYNC_DELAY = 0.1  # the longest a lost exit waits for its re-check while hints pour in
# Counted from start, so that every one is shown (and exported) from the first scrape.
COUNTERS = (
    *("exit_hints", "resyncs", "removal_errors", "refusals", "gave_up"),
    *RECONCILE_COUNTERS,
    # and each kind's own, which its removals move (hook_runs, ...)
    *(key for reg in registry.KINDS for key in reg.counters),
)


@dataclass(frozen=True)
class _Ask:
    """Run `fn` on the loop thread, where the index may be read safely."""

    fn: Callable[[], object]
    answer: Future


_STOP = object()


class Agent:
    """Owns the index. Every input (hints, resource changes, finished removals, questions)
    arrives on one queue and is handled by one thread, so the index needs no lock; removals
    run on a thread pool so a slow one never holds up the next death."""

    def __init__(
        self,
        settings: Settings,
        kinds: Iterable[ResourceKind],
        source: Source | None = None,
        recorder: Recorder | None = None,
        watchdog: Callable[[], None] | None = None,
        watchdog_interval: float | None = None,
    ) -> None:
        self.settings = settings
        self.kinds = {k.kind: k for k in kinds}
        self.source = source
        self.recorder = recorder or Recorder()
        self.index = Index()
        self._watchdog, self._watchdog_interval = watchdog, watchdog_interval
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._removals = Removals(settings, self.recorder, self._queue.put)
        self._awaiting_snapshot = set(self.kinds)
        self._lost_logged, self._lost_unlogged = float("-inf"), 0
        self._resync_since: float | None = None  # hints were lost; re-check once caught up
        self._rechecks = Rechecks()
        self._elsewhere = elsewhere.Elsewhere()
        self._periodic = Periodic(settings.reconcile_interval, list(self.kinds.values()))
        self._stopped = False

    # -- inputs ---------------------------------------------------------------------------

    def submit(self, item: object) -> None:
        """Queue a hint or a resource change; callable from any thread."""
        self._queue.put(item)

    def stop(self) -> None:
        """Ask run() to return; callable from any thread or a signal handler."""
        self._queue.put(_STOP)

    def ask(self, fn: Callable[[], T]) -> T:
        """fn() computed on the loop thread. Raises TimeoutError if the loop is busy or
        has stopped."""
        if self._stopped:
            raise TimeoutError("the agent has stopped")
        answer: Future[T] = Future()
        self._queue.put(_Ask(fn, answer))
        return answer.result(ASK_TIMEOUT)

    # -- running --------------------------------------------------------------------------

    def run(self) -> None:
        """Watch until stop() is called, then stop watching; removals under way go on (see
        drain())."""
        if self.source is not None:
            self.source.start(self.submit)
        for kind in self.kinds.values():
            kind.start(self.submit)
        self._periodic.start(self.submit)
        try:
            while self._step():
                pass
        finally:
            self._stopped = True
            self._refuse_questions()
            self._stop_parts()
            self._removals.shutdown(wait=False)

    def _stop_parts(self) -> None:
        """Stop the source and the kinds side by side: each may take up to its own deadline
        to join its thread, and one after another they would overrun the shutdown budget."""
        parts: list[ResourceKind | Source] = [*self.kinds.values(), *filter(None, [self.source])]
        stoppers = [threading.Thread(target=p.stop, daemon=True) for p in parts]
        for stopper in stoppers:
            stopper.start()
        deadline = time.monotonic() + shutdown.PART
        for stopper in stoppers:
            stopper.join(max(0.0, deadline - time.monotonic()))

    def _refuse_questions(self) -> None:
        """Answer what is still queued for the loop, so no asker waits out its timeout."""
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, _Ask):
                item.answer.set_exception(TimeoutError("the agent has stopped"))

    def drain(self, timeout: float) -> int:
        return self._removals.drain(timeout)  # how many were still running after `timeout`

    def reconcile(self) -> list[str]:
        """One pass over everything that exists now: reap what dead owners hold, and wait.
        Returns what could not be listed, one line each; the other kinds are reaped all
        the same."""
        problems = []
        for kind in self.kinds.values():
            try:
                snapshot = kind.scan()
            except Exception as err:  # the engine is down, a full fd table...
                log.error("cannot list the %ss: %s", kind.kind, err)
                problems.append(f"could not list the {kind.kind}s: {err}")
                continue
            self._handle(snapshot)
        # An owner whose liveness could not be read is judged again, up to reap_attempts
        # times: a one-shot reap must neither skip it silently nor wait for ever.
        while self._removals.busy() or self._rechecks:
            if not self._removals.busy() and self._rechecks.exhausted(self.settings.reap_attempts):
                break
            self._step()
        self._removals.shutdown(wait=True)
        problem = self._rechecks.problem()
        return problems + ([problem] if problem else [])

    def _step(self) -> bool:
        now = time.monotonic()
        dues = [d - now for d in (self._removals.next_due(), self._rechecks.due) if d is not None]
        dues += [d for d in (self._periodic.timeout(now), self._watchdog_interval) if d is not None]
        timeout = max(0.0, min(dues)) if dues else None
        if self._resync_since is not None:
            timeout = 0
        try:
            item = self._queue.get(timeout=timeout)
        except queue.Empty:
            item = None
        if self._watchdog is not None:
            self._watchdog()
        if item is _STOP:
            return False
        # Whatever one item or one owner does, the loop (and every retry with it) goes on.
        try:
            self._due(time.monotonic())
        except Exception:
            log.exception("starting the retries or the re-check that are due failed")
        if item is not None:
            try:
                self._handle(item)
            except Exception:
                log.exception("handling %s failed", type(item).__name__)
        return True

    def _due(self, now: float) -> None:
        """Start the retries that are due, and the re-check of every owner once hints were
        lost: when the queue is drained, or RESYNC_DELAY after the first loss at the latest
        (a storm can overflow the buffer many times a second and keep the queue busy)."""
        self._removals.start_due(now)
        self._periodic.tick(now)
        if self._resync_since is not None and (
            self._queue.empty() or now - self._resync_since >= RESYNC_DELAY
        ):
            self._resync_since = None
            self.recorder.count("resyncs")
            for owner in self.index.owners():
                self._confirm(owner, now)
        if self._rechecks.due is not None and self._rechecks.due <= now:
            rewatch, judge = self._rechecks.take()
            for owner in rewatch:
                # Watched at last, it is judged again: it may have died while unwatched.
                if self.index.resources(owner) and self._watch(owner):
                    judge.setdefault(owner, (now, None))
            for owner, (at, status) in judge.items():
                if self.index.resources(owner):  # not reaped or forgotten meanwhile
                    self._confirm(owner, at, status)
                else:
                    self._rechecks.forget(owner)

    def _handle(self, item: object) -> None:
        match item:
            case Exit():
                self.recorder.count("exit_hints")
                self._on_exit(item)
            case Lost(reason=reason):
                self._log_lost(reason)
                if self._resync_since is None:
                    self._resync_since = time.monotonic()
            case Found(resource=res):
                self._removals.forget((res.kind, res.key))
                self._periodic.changed(res.kind, res.key, res)
                new, displaced = self.index.add(res)
                if displaced is not None:
                    self._unwatch(displaced)
                if new:
                    self._admit(res.owner)
            case Gone(kind=kind, key=key):
                self._removals.forget((kind, key))
                self._periodic.changed(kind, key, None)
                emptied = self.index.discard(kind, key)
                if emptied is not None:
                    self._unwatch(emptied)
            case Snapshot(kind=kind, resources=resources, scopes=scopes):
                self._removals.forget_missing(kind, (r.key for r in resources), item.covers)
                self._periodic.replaced(kind, scopes)
                added, left = self.index.replace_kind(kind, resources, scopes)
                for owner in left:
                    self._unwatch(owner)
                for owner in added:
                    self._admit(owner)
                if self._awaiting_snapshot:
                    self._awaiting_snapshot.discard(kind)
                    if not self._awaiting_snapshot:
                        self._periodic.ready(time.monotonic(), self.recorder)
                        log.info("ready: watching %d owners", len(self.index))
            case Done():
                # Gone, or refused: a listing made before is stale on these, unless a newer
                # Found (a new owner's marker, say) put them back in the index meanwhile.
                for r in self._removals.finished(item):
                    if self.index.owner(r.kind, r.key) is None:
                        self._periodic.changed(r.kind, r.key, None)
            case Scanned():
                self._reconciled(item)
            case Acted(owner=owner, why=why, outcome=outcome):
                self.recorder.acted(owner, why, outcome)
            case _Ask(fn=fn, answer=answer):
                try:
                    answer.set_result(fn())
                except Exception as err:
                    answer.set_exception(err)

    def _reconciled(self, scanned: Scanned) -> None:
        """A periodic reconcile's listings, judged like the start-up one: so what was
        missed, refused or given up since is tried again."""
        # A kind whose start-up listing is still missing (its engine down since boot, say)
        # has no watcher behind it: the run counts as one that could not list it.
        waiting = tuple(f"{k}: no start-up listing yet" for k in sorted(self._awaiting_snapshot))
        scanned = replace(scanned, errors=scanned.errors + waiting)
        listed, fresh = 0, []
        for snap in self._periodic.merge(scanned):
            listed += len(snap.resources)
            # Only the differences are handled: a listing of 100,000 unchanged workdirs
            # costs the loop lookups rather than re-indexing, so exits wait milliseconds.
            for res in snap.resources:
                pair = (res.kind, res.key)
                if self.index.owner(*pair) != res.owner and not self._removals.under_way(pair):
                    fresh.append(res)
                    self._handle(Found(res))
            listing = {r.key for r in snap.resources}
            for key in filter(snap.covers, self.index.keys(snap.kind) - listing):
                self._handle(Gone(snap.kind, key))
            # What was given up and is gone now left the index, so no Gone comes for it.
            self._removals.forget_missing(snap.kind, listing, snap.covers)
        # Every owner is judged again, not only those the listings brought: one whose
        # judgement was lost on any path would otherwise be held for good.
        now = time.monotonic()
        for owner in self.index.owners():
            if not self._rechecks.waiting(owner):
                self._confirm(owner, now)
        self._periodic.finished(scanned, listed, fresh, self._removals.under_way, self.recorder)

    # -- confirm --------------------------------------------------------------------------

    def _log_lost(self, reason: str) -> None:
        now = time.monotonic()
        if now - self._lost_logged < LOST_LOG_EVERY:
            self._lost_unlogged += 1
            return
        more = f", and {self._lost_unlogged} more times since" if self._lost_unlogged else ""
        log.warning(
            "exit hints lost (%s%s); re-checking all %d owners", reason, more, len(self.index)
        )
        self._lost_logged, self._lost_unlogged = now, 0

    def _on_exit(self, hint: Exit) -> None:
        for owner in list(self.index.owners_of_pid(hint.pid)):
            # An event that carries a start time names exactly one process.
            if hint.starttime is not None and hint.starttime != owner.starttime:
                continue
            self._confirm(owner, hint.at or time.monotonic(), hint.status)

    def _admit(self, owner: Owner) -> None:
        """A new owner: watch it first, then confirm, so a death in between is not missed.
        It is confirmed even when the watch failed: one dead already goes at once. Another
        machine's is neither watched nor judged: its pid names nobody here."""
        if self._elsewhere.admit(owner):
            return
        self._watch(owner)
        self._confirm(owner, time.monotonic())

    def _watch(self, owner: Owner) -> bool:
        """Whether the source watches `owner` now; if it failed to, the watch is tried
        again, and the owner judged again once it is watched."""
        if self.source is None:
            return True
        try:
            self.source.watch(owner)
        except Exception as err:  # SourceError, OSError (a full fd table), a bug
            self._rechecks.unwatched(owner, self.source.name, err)
            return False
        self._rechecks.watched(owner)
        return True

    def _unwatch(self, owner: Owner) -> None:
        self._rechecks.watched(owner)
        if self.source is None:
            return
        try:
            self.source.unwatch(owner)
        except Exception as err:
            # A watch left behind costs a hint about nobody; it must not keep what comes
            # next (a new owner's admission, the rest of a listing) from happening.
            log.warning("%s cannot unwatch owner %s: %s", self.source.name, owner, err)

    def _confirm(self, owner: Owner, at: float, status: int | None = None) -> None:
        try:
            reason = death(owner)
        except Exception as err:
            # Not "gone" (that reads as dead): /proc could not be read now, say with the fd
            # table full. The hint is kept, and the owner judged again soon.
            self._rechecks.unreadable(owner, at, status, err)
            return
        self._rechecks.judged(owner)
        if reason is None:
            return
        # A zombie's reason already tells its wait status, read from /proc.
        zombie = reason.startswith("zombie")
        how = reason if status is None or zombie else f"{describe_status(status)} ({reason})"
        resources = self.index.pop_owner(owner)
        self._removals.start(owner, self.kinds, resources, how, at)
        self._unwatch(owner)

    # -- what status and metrics see (call through ask()) ---------------------------------

    def pending(self) -> list[Pending]:
        return self._removals.pending()

    def counters(self) -> dict[str, int]:
        counters = dict.fromkeys(COUNTERS, 0)
        counters.update(self.recorder.counters())
        counters["exits_seen"] = self.source.events_seen if self.source else 0
        counters["events_lost"] = self.source.lost if self.source else 0
        return counters

    def gauges(self) -> Gauges:
        jobs = self._removals.jobs()
        # Only kinds whose long removal says something hangs (not hooks): that is what
        # the oldest-pending gauge is watched for.
        aging = [job.at for job in jobs if job.kind.ages_pending]
        # Every kind, held or not: a series that appears only once a kind holds
        # something reads "no data" on a dashboard or to an alert until then.
        away, theirs = elsewhere.held(self.index)
        held = dict.fromkeys(self.kinds, 0) | dict(self.index.counts - theirs)
        last = self._periodic.last.at if self._periodic.last else None
        interval = self._periodic.interval
        return gauges(len(self.index) - away, held, len(jobs), aging, last, interval, away)

    @property
    def periodic(self) -> Periodic:
        return self._periodic
