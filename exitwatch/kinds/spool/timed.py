"""What the spool kinds that act on live owners at set times share (leases, watchdogs): the
entries they follow, kept as the discovery tells of them, each with the time it is next due,
and a timer thread that acts on each as it comes due. A heap of (due, key) holds the times;
one that is no longer the entry's own is passed over when it comes up, rather than removed.
"""

from __future__ import annotations

import abc
import heapq
import threading
import time
from collections.abc import Callable, KeysView

from exitwatch.kinds.base import Change, Found, Gone, Notify, Snapshot
from exitwatch.kinds.spool.entry import Entry
from exitwatch.kinds.spool.kind import SpoolKind


class TimedSpoolKind(SpoolKind):
    """A spool kind with a timer. Its subclass keeps what it follows, by key, and says what
    becomes of an entry seen or gone, and what is done when one comes due; all of it under
    `_cond`, which the timer holds while it acts."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self._cond = threading.Condition()
        self._heap: list[tuple[float, str]] = []
        self._stopping = False
        self._thread: threading.Thread | None = None

    @abc.abstractmethod
    def _followed(self) -> KeysView[str]:
        """The keys of the entries it follows."""

    @abc.abstractmethod
    def _seen(self, entry: Entry) -> None:
        """`entry` is in the spool (new, changed, or told again)."""

    @abc.abstractmethod
    def _went(self, key: str) -> None:
        """The entry `key` left the spool."""

    @abc.abstractmethod
    def _due_at(self, key: str) -> float | None:
        """When the entry `key` is due now (monotonic); None when it is followed no more."""

    @abc.abstractmethod
    def _act(self, key: str, now: float) -> None:
        """The entry `key` has come due."""

    def start(self, notify: Notify) -> None:
        name = f"exitwatch-{self.fmt.noun}s"
        self._thread = threading.Thread(target=self._timer, name=name, daemon=True)
        self._thread.start()

        def tell(change: Change) -> None:
            self._apply(change)
            notify(change)

        super().start(tell)

    def _apply(self, change: Change) -> None:
        with self._cond:
            match change:
                case Found(resource=Entry() as entry):
                    self._seen(entry)
                case Gone(key=key):
                    self._went(key)
                case Snapshot(resources=resources):
                    entries = [r for r in resources if isinstance(r, Entry)]
                    for key in self._followed() - {e.key for e in entries}:
                        self._went(key)
                    for entry in entries:
                        self._seen(entry)
            self._cond.notify()

    def _at(self, key: str, due: float) -> None:
        """Have the timer come back to `key` at `due` (monotonic); under `_cond`."""
        heapq.heappush(self._heap, (due, key))

    def _timer(self) -> None:
        with self._cond:
            while not self._stopping:
                now = time.monotonic()
                while self._heap and self._heap[0][0] <= now:
                    due, key = heapq.heappop(self._heap)
                    if self._due_at(key) == due:
                        self._act(key, now)
                timeout = self._heap[0][0] - now if self._heap else None
                self._cond.wait(timeout)

    def _halt(self, then: Callable[[], None] = lambda: None) -> bool:
        """Stop the timer, and under its lock do `then`; False when it was stopped already
        (what it followed may be another's now)."""
        with self._cond:
            if self._stopping:
                return False
            self._stopping = True
            then()
            self._cond.notify()
        return True

    def _join(self) -> None:
        if self._thread is not None:
            self._thread.join(2.0)
