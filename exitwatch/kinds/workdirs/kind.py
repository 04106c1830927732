"""Workdirs: directories under configured roots that hold an owner marker.

Discovery walks the roots (tree.py) and then follows them with inotify
(watch.py). Removal runs as root in directories that users control, so it acts
only through directory file descriptors that were opened without following symlinks or
crossing mounts, and checks again before acting.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import logging
import os
from collections.abc import Callable, Sequence
from typing import Any, TypedDict

from exitwatch.contract import MARKER
from exitwatch.kinds import fsops
from exitwatch.kinds.base import Notify, Outcome, Resource, ResourceKind, Snapshot
from exitwatch.kinds.discovery import Discovery
from exitwatch.kinds.fsops import printable
from exitwatch.kinds.workdirs import marker, walk
from exitwatch.kinds.workdirs.tree import Tree, split
from exitwatch.kinds.workdirs.watch import follow
from exitwatch.owner import Owner, death

log = logging.getLogger(__name__)

KIND = "workdir"

# Children of a dead owner may still be writing into its workdir: empty it this many times
# within one of the agent's attempts (reap_attempts in all) before that attempt fails.
REMOVE_PASSES = 3


class _Refused(Exception):
    """A safety check leaves the workdir alone; the message says why."""


class WorkdirsHealth(TypedDict):
    """The status document's `workdirs` entry."""

    discovery: str  # how workdirs are followed now, and why


class Workdirs(ResourceKind):
    kind = KIND

    def __init__(self, roots: Sequence[str] = ("/tmp", "/var/tmp"), depth: int = 3) -> None:
        if depth < 1:
            raise ValueError(f"depth must be at least 1, not {depth}")
        # Roots are the administrator's choice: resolve their symlinks once, so that every
        # path below them can be opened without following any.
        self.roots = tuple(dict.fromkeys(os.path.realpath(r) for r in roots))
        self.depth = depth
        self._discovery = Discovery("workdir discovery", "exitwatch-workdirs")
        self.discovery = "not started"  # how workdirs are followed now, and why; for status
        self._followed: Tree | None = None  # the discovery thread's, once started

    def health(self) -> WorkdirsHealth:
        return {"discovery": self.discovery}

    # Discovery

    def scan(self) -> Snapshot:
        """Every workdir now. Raises OSError when a marker cannot be read for now (a full
        fd table, a lease): a scan's walk does not stand by what was known of it, and a
        listing without it would read as its workdir gone. Beside a running discovery
        thread, a marker it has read is not read again while its stat stays. One its owner
        keeps from root (EACCES under a FUSE mount) is skipped with a warning, as it always
        is: it would fail every listing."""
        tree = Tree(KIND, self.roots, self.depth, self._followed)
        found = tree.walk_roots(None)
        if tree.transient:
            first = printable(os.path.join(min(tree.transient), MARKER))
            raise OSError(f"{len(tree.transient)} markers unreadable now, {first} the first")
        return Snapshot(KIND, tuple(found[p] for p in sorted(found)), tree.warned())

    def start(self, notify: Notify) -> None:
        tree = self._followed = Tree(KIND, self.roots, self.depth)
        mode = functools.partial(setattr, self, "discovery")
        self._discovery.start(lambda stop_fd: follow(tree, KIND, notify, stop_fd, mode))

    def stop(self) -> None:
        self._discovery.stop()

    # Removal

    def what(self, res: Resource) -> str:
        return _what(res.key)

    def remove(
        self, owner: Owner, resources: list[Resource], dry_run: bool, how: str
    ) -> list[Outcome]:
        # Each names its workdir, so that only the ones that failed are retried.
        return [
            dataclasses.replace(self._remove_one(owner, res.key, dry_run), key=res.key)
            for res in resources
        ]

    def _remove_one(self, owner: Owner, path: str, dry_run: bool) -> Outcome:
        def act() -> Outcome:
            root, parts = self._locate(path)
            parent = _opened(fsops.open_under, root, parts[:-1])
            try:
                fd = _opened(fsops.open_dir, parent, parts[-1])
                try:
                    return _remove_open(owner, _what(path), parent, parts[-1], fd, dry_run)
                finally:
                    os.close(fd)
            finally:
                os.close(parent)

        return _judged(_what(path), act)

    def _locate(self, path: str) -> tuple[str, list[str]]:
        if not os.path.isabs(path) or os.path.normpath(path) != path or "\0" in path:
            raise _Refused("the path is not absolute and normalized")
        if path in self.roots:
            raise _Refused("it is a workdir root, and a root is never removed")
        where = split(self.roots, path)
        if where is None:
            roots = ", ".join(map(printable, self.roots))
            raise _Refused(f"it is not under a workdir root ({roots})")
        if len(where[1]) > self.depth:
            raise _Refused(f"it is more than {self.depth} levels below {printable(where[0])}")
        return where


def remove_made(owner: Owner, parent: int, name: str, made: int, path: str) -> Outcome:
    """Remove the workdir `name` of the open directory `parent` by the checks remove()
    makes, if it is still the directory open as `made`: one put in its place since, marked
    alike or not, is refused, and so is `made` moved elsewhere. For `exitwatch run`, which
    made it and has held both descriptors since; `path` names it in messages."""

    def act() -> Outcome:
        try:
            fd = _opened(fsops.open_dir, parent, name)
        except FileNotFoundError:
            if os.fstat(made).st_nlink:  # a removed directory has no links left
                raise _Refused("it was moved elsewhere") from None
            raise
        try:
            st, mst = os.fstat(fd), os.fstat(made)
            if (st.st_dev, st.st_ino) != (mst.st_dev, mst.st_ino):
                raise _Refused("another directory was put in its place")
            return _remove_open(owner, _what(path), parent, name, fd, False)
        finally:
            os.close(fd)

    return dataclasses.replace(_judged(_what(path), act), key=path)


def _opened(opener: Callable[..., int], *args: Any) -> int:
    """opener(*args), its symlink and mount errors turned into refusals."""
    try:
        return opener(*args)
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.ENOTDIR):
            raise _Refused("it or a directory above it is a symlink or not a directory") from None
        if err.errno == errno.EXDEV:
            raise _Refused(
                "it or a directory above it is a mount point or on another filesystem"
            ) from None
        raise


def _judged(what: str, act: Callable[[], Outcome]) -> Outcome:
    """act()'s outcome, or what its refusal or error makes of the removal."""
    try:
        return act()
    except _Refused as why:
        log.warning("%s: refused to remove: %s", what, why)
        return Outcome.refusal(what, KIND, str(why))
    except FileNotFoundError:
        return Outcome.done(what, KIND, "already gone")
    except OSError as err:
        log.warning("%s: removal failed: %s", what, err.strerror or err)
        return Outcome.failed(what, KIND, f"failed: {err.strerror or err}")


def _remove_open(
    owner: Owner, what: str, parent: int, name: str, fd: int, dry_run: bool
) -> Outcome:
    st = os.fstat(fd)
    try:
        marker_owner, mst = marker.read(fd)
    except FileNotFoundError:
        raise _Refused("it has no marker") from None
    except marker.MarkerError as err:
        raise _Refused(f"its marker {err}") from None
    if marker_owner != owner:
        raise _Refused(f"its marker names owner {marker_owner}, not {owner}")
    why = marker.claim(st, mst)
    if why is not None:
        raise _Refused(f"its marker {why}")
    if dry_run:
        return Outcome.done(what, KIND, "would remove")
    left: list[walk.Left] = []
    for _ in range(REMOVE_PASSES):
        left = walk.empty_dir(fd, functools.partial(_foreign, owner=owner), MARKER)
        if any(kept for _, _, kept in left):
            break
        if left:
            continue
        # The marker goes last, so a workdir that could not be emptied is found again.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(MARKER, dir_fd=fd)
        if _rmdir_same(parent, name, st):
            return Outcome.done(what, KIND)
        left = [(".", "entries appeared during removal", False)]
    lines = [f"{printable(rel)}: {why}" for rel, why, _ in left]
    shown = "; ".join(lines[:5]) + (f"; and {len(lines) - 5} more" if len(lines) > 5 else "")
    log.warning("%s: left in place: %s", what, shown)
    kept = any(kept for _, _, kept in left)
    detail = f"left {len(lines)} entries: {shown}"
    return Outcome(
        what=what, kind=KIND, ok=False, detail=detail, refused=kept, extra={"left": lines}
    )


def _what(path: str) -> str:
    return f"workdir {printable(path)}"


def _foreign(fd: int, owner: Owner) -> str | None:
    """Why a nested directory is not ours to remove: it is the workdir of another owner who
    lives, or its marker is in doubt. A nested workdir of the same owner or of a dead one
    goes with the outer one. Raises OSError when that cannot be told now."""
    try:
        other, mst = marker.read(fd)
    except FileNotFoundError:
        return None
    except marker.MarkerError as err:
        return f"it holds a marker that {err}"
    if other == owner:
        return None
    why = marker.claim(os.fstat(fd), mst)
    if why is not None:
        return f"it holds a marker of another owner, {other}, that {why}"
    if death(other) is None:
        return f"it is the workdir of another owner, {other}, who is alive"
    return None


def _rmdir_same(parent: int, name: str, st: os.stat_result) -> bool:
    """rmdir `name` in `parent` if it is still the directory `st`; False if not empty."""
    try:
        now = os.stat(name, dir_fd=parent, follow_symlinks=False)
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            raise _Refused("it was replaced during removal")
        os.rmdir(name, dir_fd=parent)
    except FileNotFoundError:
        return True
    except OSError as err:
        if err.errno == errno.ENOTEMPTY:
            return False
        if err.errno == errno.ENOTDIR:  # became a symlink since the stat
            raise _Refused("it was replaced during removal") from None
        raise
    return True
