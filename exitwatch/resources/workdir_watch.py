"""Following the workdir roots: a Snapshot of the workdirs, then each change as it happens,
with inotify, or with rescans when inotify cannot be used.

What makes a directory a workdir is the Tree's business (workdirs.py gives one); this module
knows only which directories to watch and which events make one worth looking at again.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Callable, Iterable
from typing import Protocol

from exitwatch.contract import MARKER
from exitwatch.resources import fsops
from exitwatch.resources.base import Found, Gone, Notify, Resource, Snapshot
from exitwatch.resources.discovery import wait

log = logging.getLogger(__name__)

POLL_INTERVAL = 1.0  # seconds between rescans when inotify cannot be used
# IN_CREATE too: a marker made in place by link, symlink or mknod raises nothing else.
_MARKER_CHANGED = fsops.IN_CREATE | fsops.IN_MOVED_TO | fsops.IN_CLOSE_WRITE
_MARKER_CHANGED |= fsops.IN_DELETE | fsops.IN_MOVED_FROM
_SELF_GONE = fsops.IN_DELETE_SELF | fsops.IN_MOVE_SELF | fsops.IN_UNMOUNT | fsops.IN_IGNORED

Watch = Callable[[int, str, int], None]  # (open directory, its path, its depth)


class Tree(Protocol):
    """The workdirs below the roots, as the workdir kind finds them."""

    roots: tuple[str, ...]
    depth: int  # how many levels below its root a workdir may lie

    def walk_roots(self, watch: Watch | None) -> dict[str, Resource]:
        """Every workdir below the roots, by path; `watch` sees each directory before it is
        read, down to the depth limit but not below a marked one."""
        ...

    def walk(self, path: str, depth: int, watch: Watch, fresh: bool) -> dict[str, Resource]:
        """The same at and below `path`, `depth` levels below its root; {} when it is gone
        or no longer a plain directory. `fresh`: its marker was just created in place."""
        ...

    def marked(self, path: str) -> bool:
        """Whether `path` held a marker when it was last walked."""
        ...

    def forget(self, path: str) -> None:
        """Drop what is remembered about `path`, which is no longer walked."""
        ...


class _Fallback(Exception):
    """inotify cannot follow the roots; the message says why."""


class _Overflow(Exception):
    """The inotify queue overflowed: changes were lost."""


def follow(tree: Tree, kind: str, notify: Notify, stop_fd: int) -> None:
    """Report the workdirs of `tree` to `notify` as resources of `kind` until `stop_fd`
    becomes readable: a Snapshot first, then Found and Gone changes."""
    try:
        _follow(tree, kind, notify, stop_fd)
        return
    except _Fallback as err:
        reason = str(err)
    except OSError as err:
        reason = f"inotify failed: {err.strerror or err}"
    except Exception:
        log.exception("inotify workdir discovery failed")
        reason = "inotify discovery failed"
    log.warning("workdir discovery falls back to rescans every %gs: %s", POLL_INTERVAL, reason)
    _poll(tree, kind, notify, stop_fd)


def _follow(tree: Tree, kind: str, notify: Notify, stop_fd: int) -> None:
    while True:  # one inotify instance per turn; an overflow starts afresh
        try:
            watcher = _Watcher(tree, kind, notify)
        except OSError as err:
            raise _Fallback(f"inotify is unavailable: {err.strerror}") from None
        try:
            watcher.sync()
            roots = ", ".join(map(fsops.printable, tree.roots))
            log.info("following workdirs under %s with inotify", roots)
            while not wait(stop_fd, watcher.ino.fd, None):
                for wd, mask, name in watcher.ino.read():
                    watcher.handle(wd, mask, name)
            return
        except _Overflow:
            log.warning("inotify queue overflowed: rescanning the workdir roots")
        finally:
            watcher.ino.close()


def _poll(tree: Tree, kind: str, notify: Notify, stop_fd: int) -> None:
    known: dict[str, Resource] | None = None
    while True:
        try:
            found = tree.walk_roots(None)
        except OSError as err:
            log.warning("workdir rescan failed, trying again: %s", err)
        except Exception:  # the last fallback: it must not die, or no workdir is seen again
            log.exception("workdir rescan failed, trying again")
        else:
            if known is None:
                known = found
                notify(Snapshot(kind, tuple(found[p] for p in sorted(found))))
            else:
                _report(kind, notify, known, found, known.keys() | found.keys())
        if wait(stop_fd, None, POLL_INTERVAL):
            return


class _Watcher:
    """One inotify instance following the roots; used by the discovery thread alone.

    Every directory down to the depth limit is watched, a marked one too (to see its marker
    go), but nothing below a marked one. An event that matters makes the directory it
    concerns be looked at again.
    """

    def __init__(self, tree: Tree, kind: str, notify: Notify) -> None:
        self.tree, self.kind, self.notify = tree, kind, notify
        self.ino = fsops.Inotify()
        self.known: dict[str, Resource] = {}
        self.visited: set[str] = set()

    def sync(self) -> None:
        """Watch everything, then report the complete set: nothing is lost in between."""
        self.known = self.tree.walk_roots(self.watch)
        self.notify(Snapshot(self.kind, tuple(self.known[p] for p in sorted(self.known))))

    def watch(self, fd: int, path: str, depth: int) -> None:
        try:
            self.ino.watch(fd, path, depth)
        except OSError as err:
            if err.errno == errno.ENOSPC:
                raise _Fallback(err.strerror) from None
            raise
        self.visited.add(path)

    def handle(self, wd: int, mask: int, name: str) -> None:
        if mask & fsops.IN_Q_OVERFLOW:
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
                self.refresh(path, depth, fresh=bool(mask & fsops.IN_CREATE))
        elif mask & fsops.IN_ISDIR and depth < self.tree.depth and not self.tree.marked(path):
            self.refresh(os.path.join(path, name), depth + 1)

    def refresh(self, path: str, depth: int, fresh: bool = False) -> None:
        """Look at `path` again: watch what is new below it, report what changed, and drop
        what is gone or now lies below a workdir."""
        before = self.ino.subtree(path)
        self.visited = set()
        found = self.tree.walk(path, depth, self.watch, fresh)
        for p in before:
            if p not in self.visited:
                self.ino.unwatch(p)
                self.tree.forget(p)
        _report(self.kind, self.notify, self.known, found, set(before) | self.visited)


def _report(
    kind: str,
    notify: Notify,
    known: dict[str, Resource],
    found: dict[str, Resource],
    paths: Iterable[str],
) -> None:
    """Report how `found` differs from `known` at `paths`, and bring `known` up to date."""
    for path in paths:
        res = found.get(path)
        if res is None:
            if known.pop(path, None) is not None:
                notify(Gone(kind, path))
        elif known.get(path) != res:
            known[path] = res
            notify(Found(res))
