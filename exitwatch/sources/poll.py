"""Exit hints from procfs checks of the watched owners, for hosts where nothing better works.

Only the watched owners are checked, not every process, so the cost grows with the
number of live runners rather than with the size of the host.
"""

from __future__ import annotations

import logging
import threading
import time

from exitwatch import procfs
from exitwatch.owner import Owner, death
from exitwatch.sources.base import Emit, Exit, Source, name_os_thread

log = logging.getLogger(__name__)

DEFAULT_INTERVAL = 1.0


def _status(owner: Owner) -> int | None:
    """The raw wait status of a dead owner that is still a zombie of this very process."""
    try:
        stat = procfs.read_stat(owner.pid)
    except ProcessLookupError:
        return None
    if stat.starttime == owner.starttime and stat.state == "Z":
        return stat.exit_code
    return None


class PollSource(Source):
    """Checks each watched owner every `interval` seconds; emits one Exit per dead owner."""

    name = "poll"

    def __init__(self, interval: float = DEFAULT_INTERVAL) -> None:
        self.interval = interval
        self._owners: set[Owner] = set()
        self._unreadable: set[Owner] = set()  # said once each, until it can be read again
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, emit: Emit) -> None:
        self._thread = threading.Thread(
            target=self._run, args=(emit,), name="exitwatch-poll", daemon=True
        )
        self._thread.start()

    def watch(self, owner: Owner) -> None:
        with self._lock:
            self._owners.add(owner)

    def unwatch(self, owner: Owner) -> None:
        with self._lock:
            self._owners.discard(owner)
            self._unreadable.discard(owner)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self, emit: Emit) -> None:
        name_os_thread(f"ew-{self.name}")
        while not self._stop.wait(self.interval):
            try:
                self._check(emit)
            except Exception:
                # A bug, not bad input: say so loudly, and keep checking.
                log.exception("poll source check failed")

    def _check(self, emit: Emit) -> None:
        with self._lock:
            owners = list(self._owners)
        for owner in owners:
            try:
                reason = death(owner)
            except OSError as err:
                # Checked again next time; said once, not at every interval.
                if owner not in self._unreadable:
                    self._unreadable.add(owner)
                    log.warning("poll: cannot check owner %s: %s", owner, err)
                continue
            self._unreadable.discard(owner)
            if reason is None:
                continue
            with self._lock:
                # Quiet from now on: the owner is dead for good; re-watching re-arms it.
                if owner not in self._owners:
                    continue
                self._owners.discard(owner)
            self.events_seen += 1
            emit(Exit(pid=owner.pid, status=_status(owner), at=time.monotonic()))
