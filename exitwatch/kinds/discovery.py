"""A kind's discovery thread: started with a stop pipe, stopped within a deadline, and the
wait its loop makes between looks. Every kind follows its resources this way: the Docker
events stream, the workdir roots, the hook spool and the process table.

And what a kind's loop is made of: a Listing turns each listing into what `notify` is told
(a Snapshot first, then Found and Gone); Rescans lists again and again, counting, logging
and spacing out the failures; inotify_else_rescans follows with inotify, and with rescans
where inotify cannot be used or fails.
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TypedDict

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


# How long rescans wait before the next pass: given how long the last took and how many
# failed in a row (0: it succeeded), the seconds.
Pause = Callable[[float, int], float]


def every(seconds: float) -> Pause:
    """The same pause after every pass."""
    return lambda took, failing: seconds


def backoff(seconds: float, most: float) -> Pause:
    """`seconds` after a pass that succeeded; after failures, twice as long for each
    failure in a row, up to `most`."""
    return lambda took, failing: min(seconds * 2**failing, most) if failing else seconds


class RescansHealth(TypedDict):
    """What health() tells of a kind's rescans."""

    rescans: int  # passes that succeeded
    failures: int
    failing: int  # failures in a row now; 0: it works
    last_error: str | None


class Rescans:
    """A kind's rescans: list, tell the Listing, pause, until a stop, which ends a pause at
    once. A failure is counted (health()) and logged, never raised: the first of a run of
    them whole (with its traceback if it is not `expected`), each one after in a line of
    its own (unless not `repeat`: then the first alone), and the listing is tried again
    after the pause. The counters may be read from any thread."""

    def __init__(
        self,
        what: str,
        pause: Pause,
        logger: logging.Logger,
        expected: tuple[type[Exception], ...] = (OSError,),
        repeat: bool = True,
    ) -> None:
        self.what = what  # for people, first in every line: "leftover processes"
        self.pause = pause
        self._log = logger  # the kind's: the lines name it
        self._expected = expected
        self._repeat = repeat
        self._lock = threading.Lock()
        self._rescans = self._failures = self._failing = 0
        self._last_error: str | None = None
        self.next = 0.0  # seconds from the last pass to the next

    def health(self) -> RescansHealth:
        with self._lock:
            return {
                "rescans": self._rescans,
                "failures": self._failures,
                "failing": self._failing,
                "last_error": self._last_error,
            }

    def run(
        self, stop_fd: int, look: Callable[[], Mapping[str, Resource]], listing: Listing
    ) -> None:
        """Pass after pass, the first at once, until `stop_fd` is readable."""
        self.next = 0.0
        while not wait(stop_fd, None, self.next):
            self.once(look, listing)

    def once(self, look: Callable[[], Mapping[str, Resource]], listing: Listing) -> bool:
        """One pass: what look() lists told to `listing`; whether it succeeded. Sets
        `next`, the pause before the next."""
        started = time.monotonic()
        try:
            listing.report(look())
        except Exception as err:  # it must not die, or nothing is seen again
            with self._lock:
                self._failures += 1
                self._failing += 1
                self._last_error = f"{type(err).__name__}: {err}"
                failing = self._failing
            self.next = self.pause(time.monotonic() - started, failing)
            self._said(err, failing)
            return False
        with self._lock:
            self._rescans += 1
            self._failing = 0
        self.next = self.pause(time.monotonic() - started, 0)
        return True

    def _said(self, err: Exception, failing: int) -> None:
        if failing == 1 and isinstance(err, self._expected):
            self._log.warning("%s: a rescan failed: %s; again in %.0f s", self.what, err, self.next)
        elif failing == 1:  # a bug: said with its traceback
            self._log.exception("%s: a rescan failed; again in %.0f s", self.what, self.next)
        elif self._repeat:
            self._log.warning(
                "%s: rescan failed %d times in a row: %s; again in %.0f s",
                self.what,
                failing,
                err,
                self.next,
            )


class Fallback(Exception):
    """inotify cannot follow a kind's resources (any more): rescans must; the message says
    why."""


class Stopped(Exception):
    """The stop was asked for in the middle of a look (a long walk)."""


def inotify_else_rescans(
    what: str, logger: logging.Logger, follow: Callable[[], None], rescan: Callable[[str], None]
) -> None:
    """follow() (with inotify) until the stop; where it cannot, or fails, say why and
    rescan(why) until the stop instead. follow() raises Fallback to say why it cannot, or
    Stopped when it saw the stop in the middle of a look; any other failure of its is a
    reason to fall back too, so that the thread never dies."""
    try:
        follow()
        return
    except Stopped:
        return
    except Fallback as err:
        why = str(err)
    except OSError as err:
        why = f"inotify failed: {err.strerror or err}"
    except Exception:
        logger.exception("inotify %s failed", what)
        why = "inotify discovery failed"
    logger.warning("%s falls back to rescans: %s", what, why)
    rescan(why)
