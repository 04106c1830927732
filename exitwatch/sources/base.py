"""The one interface every exit source implements."""

from __future__ import annotations

import abc
import ctypes
from collections.abc import Callable
from dataclasses import dataclass

from exitwatch.owner import Owner


@dataclass(frozen=True)
class Exit:
    """A hint that process `pid` (a thread-group id) may have exited. Always confirm it."""

    pid: int
    status: int | None = None  # raw wait status, where the source knows it
    starttime: int | None = None  # the exiting group leader's start time, where known
    at: float = 0.0  # time.monotonic() when the hint was received


@dataclass(frozen=True)
class Lost:
    """Hints may have been lost (ENOBUFS, a source restart): re-check every watched owner."""

    reason: str


Hint = Exit | Lost
Emit = Callable[[Hint], None]


_PR_SET_NAME = 15


def name_os_thread(name: str) -> None:
    """Name the calling thread in the kernel too (top -H, /proc/PID/task/TID/comm), so an
    operator or a benchmark can tell the reader's CPU from the rest of the agent's."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)


class SourceError(Exception):
    """A source cannot run here. The message says why, in plain words."""


class Source(abc.ABC):
    """Turns process exits into hints for the watched owners.

    `start` spawns the source's own thread, which calls `emit` for each hint about a
    watched pid. A source may emit hints for pids it was not asked about; the consumer
    ignores them. `watch`/`unwatch` may be called from any thread.
    """

    name: str
    # Exit events this source has read from the kernel (or deaths it found, polling). Only
    # its own thread writes it; readers take a possibly stale but whole int.
    events_seen: int = 0
    lost: int = 0  # times the kernel dropped events for this source (hints were lost)

    @abc.abstractmethod
    def start(self, emit: Emit) -> None: ...

    @abc.abstractmethod
    def watch(self, owner: Owner) -> None: ...

    @abc.abstractmethod
    def unwatch(self, owner: Owner) -> None: ...

    @abc.abstractmethod
    def stop(self) -> None:
        """Stop the thread and release kernel resources. Idempotent, returns promptly."""
