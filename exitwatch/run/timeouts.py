"""`exitwatch run --max-time S` and `--idle-timeout S`: the run arms the agent's watchdog on
itself (the owner), and pets it whenever CMD writes to its stdout or stderr. The agent then
ends a run that overran or fell silent exactly as it ends a runner that stopped petting its
own watchdog (kinds/watchdogs), and reaps what it held: the wrapper itself may be what
hangs.

For --idle-timeout, CMD's stdout and stderr are pipes of the wrapper's, copied as they come
to the wrapper's own: CMD sees pipes where it may have seen a terminal.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time

from exitwatch import alive

PET_EVERY = 0.05  # seconds: output more often than this pets once, not at every write
TOLD = 0.5  # a SIGTERM this near a time that is up is taken for the watchdog's


class Timeouts:
    """The run's watchdog: armed for the nearer of the idle timeout and the maximum time,
    petted on output while the idle timeout is the nearer, armed once more for what is
    left of the maximum time when that becomes the nearer."""

    def __init__(self, max_time: float | None, idle: float | None, grace: float) -> None:
        self.max_time, self.idle, self.grace = max_time, idle, grace
        self.started = time.monotonic()
        self._lock = threading.Lock()
        self._last = self.started
        self._dog: alive.Watchdog | None = None
        if idle is not None and (max_time is None or idle < max_time):
            self._final = False
            self._arm(idle, f"exitwatch run --idle-timeout {idle:g}: no output")
        else:
            assert max_time is not None
            self._final = True  # petted never
            self._arm(max_time, f"exitwatch run --max-time {max_time:g}")

    def _arm(self, timeout: float, reason: str) -> None:
        """Raises OSError (no agent's spool), ValueError."""
        self._dog = alive.watchdog(
            max(alive.WATCHDOG_MIN_TIMEOUT, timeout), grace=self.grace, reason=reason
        )

    def output(self) -> None:
        """CMD wrote something: it makes progress."""
        with self._lock:
            now = time.monotonic()
            if self._final or now - self._last < PET_EVERY:
                return
            self._last = now
            assert self.idle is not None
            if self.max_time is not None and now + self.idle >= self.started + self.max_time:
                # The maximum time ends first from here on: armed for what is left of it,
                # never petted again.
                self._final = True
                left = self.started + self.max_time - now
                with contextlib.suppress(OSError, ValueError):
                    self._arm(left, f"exitwatch run --max-time {self.max_time:g}")
                return
            assert self._dog is not None
            with contextlib.suppress(OSError):
                self._dog.pet()

    def overdue(self) -> str | None:
        """Why the agent's watchdog ends the run now, if one of its times is up (a SIGTERM
        came): one line for the run's caller; None while neither is."""
        now = time.monotonic()
        with self._lock:
            if self.max_time is not None and now - self.started >= self.max_time - TOLD:
                why = f"--max-time {self.max_time:g} s reached"
            elif self.idle is not None and now - self._last >= self.idle - TOLD:
                why = f"no output for --idle-timeout {self.idle:g} s"
            else:
                return None
        return f"{why}: the agent's watchdog ends the run"

    def cancel(self) -> None:
        """CMD has ended: what is left (ending its leftovers, removing) is the wrapper's."""
        with self._lock:
            self._final = True
            if self._dog is not None:
                with contextlib.suppress(OSError):
                    self._dog.cancel()


def relay(read_fd: int, write_fd: int, timeouts: Timeouts) -> threading.Thread:
    """A thread that copies `read_fd` (CMD's end of a pipe) to `write_fd` (the wrapper's
    own stdout or stderr) until end of file, telling `timeouts` of each chunk. When the
    wrapper's side is closed (EPIPE), it stops reading: CMD gets EPIPE as it would have."""

    def copy() -> None:
        try:
            while chunk := os.read(read_fd, 65536):
                timeouts.output()
                view = memoryview(chunk)
                while view:
                    view = view[os.write(write_fd, view) :]
        except OSError:
            pass
        finally:
            os.close(read_fd)

    thread = threading.Thread(target=copy, name="exitwatch-run-relay", daemon=True)
    thread.start()
    return thread
