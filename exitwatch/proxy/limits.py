"""How many connections the proxy serves at once: in all, below what the process may hold of
threads and descriptors, and per client, so that no client keeps the others out.

A connection costs two threads (its requests and its responses) and six descriptors: the
client's socket, the engine's, and a pipe (two descriptors) for each direction's splice
while a body or a stream moves. The process's limits are read once, at start: the soft
RLIMIT_NOFILE, and the pids.max of its cgroup and of that cgroup's ancestors (systemd's
TasksMax=, cgroup v1's pids controller or v2's). Past the total, a client is answered at
once and closed; past its share (1/SHARE of the total), the same, once its owner is known.
Nothing waits in the proxy for a slot: a client refused tries again as it would after any
error, and the others are served meanwhile.
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import socket
import threading
import time
from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass

from exitwatch.proxy import framing

log = logging.getLogger(__name__)

FDS_PER_CONNECTION = 6
FDS_SPARE = 64  # the listener, logs, /proc reads, pidfds, the proxy's own engine calls
TASKS_PER_CONNECTION = 2
TASKS_SPARE = 8  # the main thread, the accept loop, a signal or log thread, and room
MOST = 4096  # connections at once where no limit says fewer
SHARE = 4  # a client holds a quarter of the connections at most
BURST_GAP = 10.0  # seconds without a refusal that end a burst: one log line per burst
CGROUP_ROOT = "/sys/fs/cgroup"


@dataclass(frozen=True)
class Limits:
    total: int  # connections at once
    per_client: int  # connections at once of one client (its owner, else its uid)
    why: str  # what set the total, for the log


def of_process(shared: bool = True) -> Limits:
    """The limits that this process's task and descriptor limits allow. `shared`: clients
    are many (adopt), each held to its share; else one (run), which may hold them all."""
    found = [(MOST, "the proxy's own bound")]
    try:
        files = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except OSError:  # a system call filter that denies it: the other bounds hold
        files = resource.RLIM_INFINITY
    if files != resource.RLIM_INFINITY:
        n = (files - FDS_SPARE) // FDS_PER_CONNECTION
        found.append((n, f"RLIMIT_NOFILE {files} ({FDS_PER_CONNECTION} per connection)"))
    tasks = tasks_max()
    if tasks is not None:
        n = (tasks - TASKS_SPARE) // TASKS_PER_CONNECTION
        found.append((n, f"pids.max {tasks} ({TASKS_PER_CONNECTION} threads per connection)"))
    total, why = min(found)
    total = max(1, total)
    return Limits(total, max(1, total // SHARE) if shared else total, why)


def tasks_max(cgroups: str = "/proc/self/cgroup", root: str = CGROUP_ROOT) -> int | None:
    """The lowest pids.max of this process's cgroup and its ancestors, or None for none."""
    try:
        with open(cgroups) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    hierarchy = None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "pids" in controllers.split(","):  # cgroup v1's pids hierarchy: it holds the controller
            hierarchy = (os.path.join(root, "pids"), path)
            break
        if controllers == "":  # cgroup v2's
            hierarchy = (root, path)
    if hierarchy is None:
        return None
    where, path = hierarchy
    lowest = None
    parts = [p for p in path.split("/") if p]
    for depth in range(len(parts), -1, -1):
        try:
            with open(os.path.join(where, *parts[:depth], "pids.max")) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit():
            lowest = int(text) if lowest is None else min(lowest, int(text))
    return lowest


class Gate:
    """The connections open, in all and by client; and the refusals, told once a burst."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._lock = threading.Lock()
        self._open = 0
        self._by_client: Counter[Hashable] = Counter()
        self._refused = 0
        self._last_refusal = float("-inf")

    def enter(self) -> bool:
        """Count one more connection, if the total allows it."""
        with self._lock:
            if self._open >= self.limits.total:
                return False
            self._open += 1
            return True

    def leave(self) -> None:
        with self._lock:
            self._open -= 1

    def claim(self, client: Hashable) -> bool:
        """Count one more connection of `client`, if its share allows it."""
        with self._lock:
            if self._by_client[client] >= self.limits.per_client:
                return False
            self._by_client[client] += 1
            return True

    def unclaim(self, client: Hashable) -> None:
        with self._lock:
            self._by_client[client] -= 1
            if self._by_client[client] <= 0:
                del self._by_client[client]

    def turn_away(self, client: socket.socket, why: str) -> None:
        """Answer `client` 503 with `why` and close it, without blocking; logged once a
        burst. A unix socket's peer reads what was sent before the close, whatever it had
        sent itself: the answer is never lost to a reset."""
        self._told(why)
        with contextlib.suppress(OSError):
            client.send(framing.answer(503, f"{why}; try again later", True), socket.MSG_DONTWAIT)
        client.close()

    def _told(self, why: str) -> None:
        with self._lock:
            now = time.monotonic()
            first = now - self._last_refusal > BURST_GAP
            self._last_refusal = now
            before, self._refused = self._refused, 1 if first else self._refused + 1
        if first:
            after = f" ({before} refused in the burst before)" if before > 1 else ""
            log.warning(
                "connections refused: %s (at most %d at once, %d per client: %s)%s",
                why,
                self.limits.total,
                self.limits.per_client,
                self.limits.why,
                after,
            )
