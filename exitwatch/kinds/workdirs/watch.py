"""Following the workdir roots: a Snapshot of the workdirs, then each change as it happens,
with inotify, or with rescans when inotify cannot be used.

What makes a directory a workdir is the Tree's business (tree.py gives one); this module
knows only which directories to watch and which events make one worth looking at again.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Callable
from typing import Protocol

from exitwatch.contract import MARKER
from exitwatch.kinds import fsops, inotify
from exitwatch.kinds.base import Notify, Resource
from exitwatch.kinds.discovery import (
    Fallback,
    Listing,
    Rescans,
    Stopped,
    inotify_else_rescans,
    wait,
)

log = logging.getLogger(__name__)

POLL_INTERVAL = 1.0  # the least time between rescans when inotify cannot be used
# A rescan may take at most this share of the time between rescans: a tree too big for the
# watches is also too big to walk every second.
RESCAN_SHARE = 0.1
POLL_MAX = 60.0  # the most time between rescans (a new workdir waits at most this long)
RECHECK = 2.0  # seconds before what could not be read is looked at again
STOP_EVERY = 1000  # directories watched between two looks for a stop
# IN_CREATE too: a marker made in place by link, symlink or mknod raises nothing else.
_MARKER_CHANGED = inotify.IN_CREATE | inotify.IN_MOVED_TO | inotify.IN_CLOSE_WRITE
_MARKER_CHANGED |= inotify.IN_DELETE | inotify.IN_MOVED_FROM
_SELF_GONE = inotify.IN_DELETE_SELF | inotify.IN_MOVE_SELF | inotify.IN_UNMOUNT | inotify.IN_IGNORED

Watch = Callable[[int, str, int], None]  # (open directory, its path, its depth)
Mode = Callable[[str], None]  # told how discovery works now, for status


class Tree(Protocol):
    """The workdirs below the roots, as the workdir kind finds them."""

    roots: tuple[str, ...]
    depth: int  # how many levels below its root a workdir may lie
    unsure: set[str]  # directories whose marker could not be read: look again later
    racy: set[str]  # whose marker was read just after it changed: look again later

    def walk_roots(self, watch: Watch | None) -> dict[str, Resource]:
        """Every workdir below the roots, by path; `watch` sees each directory before it is
        read, down to the depth limit but not below one that `hides`. Raises OSError when
        a directory could not be read for a reason other than its being gone."""
        ...

    def walk(self, path: str, depth: int, watch: Watch, fresh: bool) -> dict[str, Resource]:
        """The same at and below `path`, `depth` levels below its root; {} when it is gone
        or no longer a plain directory. `fresh`: its marker was just created in place."""
        ...

    def hides(self, path: str) -> bool:
        """Whether what lies below `path` was the content of a workdir when last walked."""
        ...

    def forget(self, path: str) -> None:
        """Drop what is remembered about `path`, which is no longer walked."""
        ...


class _Overflow(Exception):
    """The inotify queue overflowed: changes were lost."""


def follow(tree: Tree, kind: str, notify: Notify, stop_fd: int, mode: Mode) -> None:
    """Report the workdirs of `tree` to `notify` as resources of `kind` until `stop_fd`
    becomes readable: a Snapshot first, then Found and Gone changes. `mode` is told how."""
    inotify_else_rescans(
        "workdir discovery",
        log,
        lambda: _follow(tree, kind, notify, stop_fd, mode),
        lambda why: _poll(tree, kind, notify, stop_fd, mode, why),
    )


def _follow(tree: Tree, kind: str, notify: Notify, stop_fd: int, mode: Mode) -> None:
    while True:  # one inotify instance per turn; an overflow starts afresh
        try:
            watcher = _Watcher(tree, kind, notify, stop_fd)
        except OSError as err:
            raise Fallback(f"inotify is unavailable: {err.strerror}") from None
        try:
            watcher.sync()
            roots = ", ".join(map(fsops.printable, tree.roots))
            log.info("following workdirs under %s with inotify", roots)
            mode("inotify")
            timeout: float | None = None
            while not wait(stop_fd, watcher.ino.fd, timeout):
                for wd, mask, name in watcher.ino.read():
                    watcher.handle(wd, mask, name)
                timeout = watcher.recheck()
            return
        except _Overflow:
            log.warning("inotify queue overflowed: rescanning the workdir roots")
        except OSError as err:
            if err.errno not in fsops.TRANSIENT:
                raise
            # The first walk could not be done (a full fd table): nothing is concluded
            # from it, and it is done again from the start.
            log.warning("workdir discovery: %s; starting again in %g s", err, RECHECK)
            mode(f"starting again: {err.strerror or err}")
            if wait(stop_fd, None, RECHECK):
                return
        finally:
            watcher.ino.close()


def _poll(tree: Tree, kind: str, notify: Notify, stop_fd: int, mode: Mode, why: str) -> None:
    # A rescan takes at most RESCAN_SHARE of the time between two, failed or not; status
    # is told the pause, and `why` there are rescans.
    def pace(took: float, failing: int) -> float:
        every = min(POLL_MAX, max(POLL_INTERVAL, took / RESCAN_SHARE))
        mode(f"rescans every {every:.3g} s (the last took {took:.3g} s): {why}")
        return every

    rescans = Rescans("workdir discovery", pace, log)
    rescans.run(stop_fd, lambda: tree.walk_roots(None), Listing(kind, notify))


class _Watcher:
    """One inotify instance following the roots; used by the discovery thread alone.

    Every directory down to the depth limit is watched, a workdir too (to see its marker
    go), but nothing below a workdir that hides its content. An event that matters makes
    the directory it concerns be looked at again; what could not be read is looked at
    again after RECHECK.
    """

    def __init__(self, tree: Tree, kind: str, notify: Notify, stop_fd: int) -> None:
        self.tree, self.stop_fd = tree, stop_fd
        self.watched = 0  # watches added, to look for a stop every STOP_EVERY of them
        self.ino = inotify.Inotify()
        self.listing = Listing(kind, notify)
        self.visited: set[str] = set()
        self.redo: dict[str, int] = {}  # directories whose walk failed, by depth
        self.recheck_at = 0.0

    def sync(self) -> None:
        """Report the complete set, then watch everything and report what changed since.

        The Snapshot comes from a walk without watches: adding 100,000 of them costs more
        than the walk, and the agent needs the set, not the watches, to start reaping. A
        change made after the first walk looked at a directory is not lost: the second walk
        watches each directory before it reads it again, so the change is either read then
        or reported by inotify after. Markers read in the first walk are not read again
        (the tree remembers them while their stat stays).
        """
        self.listing.report(self.tree.walk_roots(None))
        self.listing.report(self.tree.walk_roots(self.watch))

    def watch(self, fd: int, path: str, depth: int) -> None:
        # The watching walk comes after the Snapshot, when a stop is likely (an agent
        # started and stopped at once): it must not hold the thread for seconds.
        self.watched += 1
        if not self.watched % STOP_EVERY and wait(self.stop_fd, None, 0):
            raise Stopped
        try:
            self.ino.watch(fd, path, depth)
        except OSError as err:
            if err.errno == errno.ENOSPC:
                raise Fallback(err.strerror) from None
            raise
        self.visited.add(path)

    def handle(self, wd: int, mask: int, name: str) -> None:
        if mask & inotify.IN_Q_OVERFLOW:
            raise _Overflow
        path = self.ino.path(wd)
        if path is None:  # unwatched since, maybe by an earlier event of the same read
            return
        depth = self.ino.dirs[path].depth
        if mask & _SELF_GONE:
            if path in self.tree.roots:
                log.warning(
                    "workdir root %s was removed or moved away; no longer followed",
                    fsops.printable(path),
                )
            self.refresh(path, depth)
        elif name == MARKER and depth:
            if mask & _MARKER_CHANGED:
                self.refresh(path, depth, fresh=bool(mask & inotify.IN_CREATE))
        elif mask & inotify.IN_ISDIR and depth < self.tree.depth and not self.tree.hides(path):
            self.refresh(os.path.join(path, name), depth + 1)

    def recheck(self) -> float | None:
        """Look again at what could not be read, or was read too soon after it changed to
        be known for what it is, once RECHECK has passed; how long until the next look, or
        None when nothing waits for one."""
        if not (self.redo or self.tree.unsure or self.tree.racy):
            return None
        now = time.monotonic()
        if now >= self.recheck_at:
            self.recheck_at = now + RECHECK
            todo = dict(self.redo)
            for path in list(self.tree.unsure) + list(self.tree.racy):
                watched = self.ino.dirs.get(path)
                if watched is not None:
                    todo.setdefault(path, watched.depth)
                else:  # not followed any more: nothing will look at it
                    self.tree.racy.discard(path)
            for path, depth in todo.items():
                self.refresh(path, depth)
        if not (self.redo or self.tree.unsure or self.tree.racy):
            return None
        return max(0.0, self.recheck_at - time.monotonic())

    def refresh(self, path: str, depth: int, fresh: bool = False) -> None:
        """Look at `path` again: watch what is new below it, report what changed, and drop
        what is gone or now lies below a workdir. A walk that fails changes nothing and is
        tried again after RECHECK."""
        before = self.ino.subtree(path)
        self.visited = set()
        try:
            found = self.tree.walk(path, depth, self.watch, fresh)
        except OSError as err:
            if path not in self.redo:  # one warning until it can be walked again
                log.warning(
                    "cannot look at %s now (%s); looking again in %g s",
                    fsops.printable(path),
                    err.strerror or err,
                    RECHECK,
                )
            self.redo[path] = depth
            return
        self.redo.pop(path, None)
        for p in before:
            if p not in self.visited:
                self.ino.unwatch(p)
                self.tree.forget(p)
        self.listing.report(found, set(before) | self.visited)
