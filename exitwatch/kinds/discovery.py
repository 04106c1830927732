"""A kind's discovery thread: started with a stop pipe, stopped within a deadline, and the
wait its loop makes between looks. Every kind follows its resources this way: the Docker
events stream, the workdir roots, the hook spool and the process table.

And what a kind's loop is made of: a Listing turns each listing into what `notify` is told
(a Snapshot first, then Found and Gone).
"""

from __future__ import annotations

import logging
import os
import select
import threading
from collections.abc import Callable, Iterable, Mapping

from exitwatch import shutdown
from exitwatch.kinds.base import Found, Gone, Notify, Resource, Snapshot

log = logging.getLogger(__name__)


class Discovery:
    """One discovery thread at a time, running `target(stop_fd)` until stop()."""

    def __init__(self, what: str, thread_name: str, wake: Callable[[], None] | None = None) -> None:
        self.what = what  # for people: "workdir discovery"
        self.thread_name = thread_name
        # For a thread that blocks elsewhere than on the stop pipe (a stream it reads):
        # called once the stop is asked for, to end that wait.
        self._wake = wake
        self._thread: threading.Thread | None = None
        self._stop_r = self._stop_w = -1

    def start(self, target: Callable[[int], None]) -> None:
        if self._thread is not None:
            raise RuntimeError(f"{self.what} is already running")
        self._stop_r, self._stop_w = os.pipe2(os.O_CLOEXEC)
        self._thread = threading.Thread(
            target=target, args=(self._stop_r,), name=self.thread_name, daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Ask the thread to stop and wait up to shutdown.PART for it. Idempotent."""
        if self._thread is None:
            return
        os.write(self._stop_w, b"x")
        if self._wake is not None:
            self._wake()
        self._thread.join(shutdown.PART)
        if self._thread.is_alive():
            # A long look (a walk of a huge tree) is under way; the thread is a daemon, and
            # it owns the pipe's read end until it notices.
            log.warning("%s did not stop within %.0f s", self.what, shutdown.PART)
        else:
            os.close(self._stop_r)
            os.close(self._stop_w)
        self._thread = None


def stopped(stop_fd: int) -> bool:
    """Whether the stop has been asked for."""
    return wait(stop_fd, None, 0)


def wait(stop_fd: int, fd: int | None, timeout: float | None) -> bool:
    """Wait until `fd` is readable or `timeout` passes; True once `stop_fd` is readable."""
    poller = select.poll()
    poller.register(stop_fd, select.POLLIN)
    if fd is not None:
        poller.register(fd, select.POLLIN)
    ready = poller.poll(None if timeout is None else timeout * 1000)
    return any(r == stop_fd for r, _ in ready)


class Listing:
    """What a discovery thread has told of one kind's resources, by key: its first listing
    is told as a Snapshot, each later one as the Gone, then the Found (new or changed),
    that make the difference. Used by that thread alone."""

    def __init__(self, kind: str, notify: Notify) -> None:
        self.kind, self.notify = kind, notify
        self.known: dict[str, Resource] | None = None  # None: nothing told yet

    def report(self, found: Mapping[str, Resource], keys: Iterable[str] | None = None) -> None:
        """Tell of `found`, the resources now by key: where `keys` are given, `found` is a
        listing of those keys alone (one directory looked at again), and only they may
        have changed."""
        known = self.known
        if known is None:
            self.known = dict(found)
            self.notify(Snapshot(self.kind, tuple(found[k] for k in sorted(found))))
            return
        if keys is None:
            gone = [k for k in known if k not in found]
            changed = [k for k, res in found.items() if known.get(k) != res]
        else:
            keys = list(keys)
            gone = [k for k in keys if k not in found and k in known]
            changed = [k for k in keys if k in found and known.get(k) != found[k]]
        for key in gone:
            del known[key]
            self.notify(Gone(self.kind, key))
        for key in changed:
            known[key] = found[key]
            self.notify(Found(found[key]))
