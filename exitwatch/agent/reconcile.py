"""The periodic reconcile: the safety net under the event path.

Every `reconcile_interval` seconds each kind's scan() lists everything that exists, on a
thread of its own so that the agent's loop keeps handling exits meanwhile, and the
listings come back through the agent's queue as one `Scanned`. The agent then feeds them
through the same path as the start-up listing, so whatever was missed, refused or given
up is judged again.

A listing is stale by the time it arrives: changes the loop handled while it was being
made (a Found, a Gone, a finished removal, a watcher's own Snapshot) are newer, so they are
journalled and laid over it before it is applied.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from exitwatch.agent.record import Recorder
from exitwatch.kinds.base import Resource, ResourceKind, Snapshot

log = logging.getLogger(__name__)

# reconciles: start-up and periodic ones done; reconcile_missed: resources a periodic one
# found that the index did not hold; reconcile_errors: periodic ones a kind failed to list.
RECONCILE_COUNTERS = ("reconciles", "reconcile_missed", "reconcile_errors")


@dataclass(frozen=True)
class Last:
    """What the last reconcile found (status shows it)."""

    at: float  # unix time it ended
    run: int  # 0: the start-up listing; then 1, 2, ...
    took: float = 0.0  # seconds its listings took
    listed: int = 0  # resources listed
    missed: int = 0  # of them, unknown to the index though their watchers should have told
    orphaned: int = 0  # of those, of dead owners (being removed now)
    errors: tuple[str, ...] = ()  # the kinds it could not list, and why


@dataclass(frozen=True)
class Scanned:
    """What one periodic reconcile listed, and what it could not list."""

    run: int
    snapshots: tuple[Snapshot, ...]
    errors: tuple[str, ...]
    took: float  # seconds the listings took


class Periodic:
    """When the next reconcile is due, its scanning thread, and what status shows of it.

    Only the agent's loop thread calls it, except the scanning thread, which only submits.
    """

    def __init__(self, interval: float, kinds: Sequence[ResourceKind]) -> None:
        self.interval = interval
        self._kinds = list(kinds)
        self._by_kind = {k.kind: k for k in self._kinds}
        self._submit: Callable[[object], None] | None = None
        self._next: float | None = None  # monotonic; None until the loop starts
        self._run = 0
        self._scanning: int | None = None  # the run under way
        # While a scan is under way: (kind, key) -> the newest Resource, or None once gone;
        # and what a watcher's own Snapshot has superseded: kind -> the scopes (None: all).
        self._journal: dict[tuple[str, str], Resource | None] = {}
        self._superseded: dict[str, set[str] | None] = {}
        self.last: Last | None = None

    def start(self, submit: Callable[[object], None]) -> None:
        """Reconcile periodically from now on (the one-shot reap never calls this): not
        from the start-up listing on, which a kind whose engine is down at boot delays
        for as long, and the safety net with it for every kind."""
        self._submit = submit
        if self.interval > 0:
            self._next = time.monotonic() + self.interval

    def ready(self, now: float, recorder: Recorder) -> None:
        """The start-up listing is in: it counts as a reconcile, the next due from now."""
        recorder.count("reconciles")
        self.last = Last(at=time.time(), run=0)
        if self.interval > 0:
            self._next = now + self.interval

    def timeout(self, now: float) -> float | None:
        """Seconds until the next reconcile is due, or None if none is."""
        if self._submit is None or self._next is None or self._scanning is not None:
            return None
        return max(0.0, self._next - now)

    def tick(self, now: float) -> None:
        """Start the reconcile that is due, unless the previous one is still listing."""
        due = self.timeout(now)
        if due is None or due > 0:
            return
        self._run += 1
        self._scanning = self._run
        self._journal, self._superseded = {}, {}
        threading.Thread(
            target=self._scan,
            args=(self._run, self._submit),
            name="exitwatch-reconcile",
            daemon=True,
        ).start()

    def _scan(self, run: int, submit: Callable[[object], None]) -> None:
        at = time.monotonic()
        snapshots, errors = [], []
        for kind in self._kinds:
            try:
                snapshots.append(kind.scan())
            except Exception as err:  # the engine is down, say: the other kinds go on
                errors.append(f"{kind.kind}: {err}")
        submit(Scanned(run, tuple(snapshots), tuple(errors), time.monotonic() - at))

    # -- the loop thread tells what happened while a scan was under way --------------------

    def changed(self, kind: str, key: str, res: Resource | None) -> None:
        if self._scanning is not None:
            self._journal[(kind, key)] = res

    def replaced(self, kind: str, scopes: tuple[str, ...] | None = None) -> None:
        """A watcher's own Snapshot of `kind` (of its `scopes`, Snapshot.scopes) is newer
        than the scan's."""
        if self._scanning is None:
            return
        if scopes is None:
            self._superseded[kind] = None
        else:
            done = self._superseded.setdefault(kind, set())
            if done is not None:
                done.update(scopes)

    def merge(self, scanned: Scanned) -> list[Snapshot]:
        """The scan's listings with the newer changes laid over them; ends the run."""
        self._scanning = None
        if self.interval > 0:
            self._next = time.monotonic() + self.interval
        out = []
        for listed in scanned.snapshots:
            snap = _unsuperseded(listed, self._superseded)
            if snap is None:
                continue
            held = {r.key: r for r in snap.resources}
            for (kind, key), res in self._journal.items():
                if kind != snap.kind:
                    continue
                if res is None:
                    held.pop(key, None)
                else:
                    held[key] = res
            out.append(Snapshot(snap.kind, tuple(held.values()), scopes=snap.scopes))
        self._journal, self._superseded = {}, {}
        return out

    def finished(
        self,
        scanned: Scanned,
        listed: int,
        fresh: Sequence[Resource],
        under_way: Callable[[tuple[str, str]], bool],
        recorder: Recorder,
    ) -> None:
        """Count, log and keep for status what the reconcile found: of the `fresh` resources
        the index did not hold, those missed (their kind's watcher should have told of them
        by now: a polling one tells of a new one at its next pass, not at once), and how
        many of those are of dead owners (their removal is `under_way`)."""
        overdue = [r for r in fresh if self._by_kind[r.kind].overdue(r)]
        missed, new = len(overdue), len(fresh) - len(overdue)
        orphaned = sum(1 for r in overdue if under_way((r.kind, r.key)))
        recorder.count("reconciles")
        recorder.count("reconcile_missed", missed)
        if scanned.errors:
            recorder.count("reconcile_errors")
        self.last = Last(
            at=time.time(),
            run=scanned.run,
            took=scanned.took,
            listed=listed,
            missed=missed,
            orphaned=orphaned,
            errors=scanned.errors,
        )
        problems = f"; could not list {'; '.join(scanned.errors)}" if scanned.errors else ""
        early = f"; {new} more too new for their watcher to have told yet" if new else ""
        log.log(
            logging.WARNING if missed or scanned.errors else logging.INFO,
            "reconcile: listed %d resources in %.2f s; %d were unknown to the index, %d of "
            "them of dead owners%s%s",
            listed,
            scanned.took,
            missed,
            orphaned,
            early,
            problems,
        )

    @property
    def running(self) -> bool:
        """Whether a reconcile is listing now."""
        return self._scanning is not None

    def next_in(self, now: float) -> float | None:
        """Seconds until the next reconcile is due; None when none is (interval 0)."""
        if self._next is None or self.interval <= 0:
            return None
        return max(0.0, self._next - now)


def _unsuperseded(snap: Snapshot, superseded: dict[str, set[str] | None]) -> Snapshot | None:
    """What of a scan's listing no watcher's own Snapshot has told since; None: nothing."""
    if snap.kind not in superseded:
        return snap
    done = superseded[snap.kind]
    if done is None:
        return None
    if snap.scopes is None:  # a whole kind's listing, part of which was told since
        return None  # dropped whole, as the next reconcile lists it again
    scopes = tuple(s for s in snap.scopes if s not in done)
    if not scopes:
        return None
    kept = tuple(r for r in snap.resources if r.key.startswith(scopes))
    return Snapshot(snap.kind, kept, snap.skipped, scopes)
