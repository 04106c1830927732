"""What makes a directory a workdir: the walk of the roots that finds the markers, and
what each marker was found to be, remembered while its stat stays (a watch.Tree).

Discovery runs as root in directories that users control: a marker is read only through a
descriptor pinned without following a symlink or crossing a mount, and it hides what lies
below its directory only when it is a valid claim (marker.claim).
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import time
from collections.abc import Iterable
from typing import NamedTuple

from exitwatch.contract import MARKER
from exitwatch.kinds import fsops
from exitwatch.kinds.base import Resource
from exitwatch.kinds.fsops import printable
from exitwatch.kinds.workdirs import marker, walk
from exitwatch.kinds.workdirs.watch import Watch

log = logging.getLogger(__name__)

# A marker changed less than this before it was read may change again with the same stat:
# file times tick coarsely (a jiffy; 2 s on FAT), so a rewrite in place of the same size
# within one tick keeps them. Such a reading is not trusted for longer than one walk.
RACY_NS = 2_000_000_000
# Errors that say a directory is no longer a plain directory at that path: it is gone.
# Anything else (EMFILE, ENOMEM, EACCES on a FUSE mount...) says nothing about it.
_GONE = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.EXDEV)


class _Seen(NamedTuple):
    """What a directory's marker was found to be, remembered while its stat stays."""

    sig: tuple[int, ...]
    res: Resource | None  # the workdir, when the marker names an owner
    hides: bool  # a valid claim: what lies below is the workdir's own content
    racy: bool = False  # read too soon after it changed: read it again next time (RACY_NS)
    said: str | None = None  # what was warned of it, so that it is warned of once


_UNMARKED = _Seen((), None, False)


def _where(path: str) -> str:
    """The marker of the directory `path`, for a message."""
    return printable(os.path.join(path, MARKER))


class Tree:
    """The workdirs below the roots, found by walking them (a watch.Tree).

    Markers are remembered between walks, so an unchanged one is neither read nor warned
    about again, unless it was read less than RACY_NS after it changed (those are in
    `racy`, to be looked at again). A marker hides what lies below its directory only when
    it is a valid claim (see marker.claim): anyone can write a marker into a shared
    directory, and that must not hide the workdirs of others below it. A marker that
    cannot be read now is in `unsure`: what was known of it stands until it is read again.
    One per scan or discovery thread. A scan may look up what the discovery thread's tree
    (`known`) has seen of a marker, without changing it: a marker whose stat has not
    changed since is not read again, and a reconcile reads only what changed.
    """

    def __init__(
        self, kind: str, roots: tuple[str, ...], depth: int, known: Tree | None = None
    ) -> None:
        self.kind = kind  # of the resources it finds: the workdir kind's KIND
        self.roots, self.depth, self.known = roots, depth, known
        self.markers: dict[str, _Seen] = {}
        self.previous: dict[str, _Seen] = {}
        self.missing_roots: set[str] = set()
        self.unsure: set[str] = set()
        self.transient: set[str] = set()  # of `unsure`, those that failed for want of fds...
        self.racy: set[str] = set()

    def walk_roots(self, watch: Watch | None) -> dict[str, Resource]:
        self.previous, self.markers = self.markers, {}
        found: dict[str, Resource] = {}
        for root in self.roots:
            try:
                fd = fsops.open_under(root, ())
            except OSError as err:
                if err.errno in fsops.TRANSIENT:
                    raise
                if root not in self.missing_roots:
                    log.warning("workdir root %s: %s; skipped", printable(root), err.strerror)
                self.missing_roots.add(root)
                continue
            self.missing_roots.discard(root)
            found.update(self._walk(fd, root, 0, watch, False))
        self.previous = {}
        return found

    def walk(self, path: str, depth: int, watch: Watch, fresh: bool) -> dict[str, Resource]:
        where = split(self.roots, path)
        if where is None:  # a root that went away
            return {}
        try:
            fd = fsops.open_under(*where)
        except OSError as err:
            if err.errno in _GONE:
                return {}
            raise
        return self._walk(fd, path, depth, watch, fresh)

    def warned(self) -> int:
        """How many markers the last walk found malformed, not a valid claim, or unreadable
        now: each was warned of (once)."""
        return len({p for p, s in self.markers.items() if s.said is not None} | self.unsure)

    def hides(self, path: str) -> bool:
        seen = self.markers.get(path)
        return seen is not None and seen.hides

    def forget(self, path: str) -> None:
        self._forget(path)

    def _walk(
        self, fd: int, path: str, depth: int, watch: Watch | None, fresh: bool
    ) -> dict[str, Resource]:
        """Workdirs at or below the open directory `fd`, which is `path`, `depth` levels
        below its root. Closes `fd`. With `watch`, each directory is watched before it is
        read, so nothing created meanwhile goes unseen."""
        found: dict[str, Resource] = {}
        below = fsops.have_openat2()  # markers can be read from the parent, safely

        def visit(at: int, name: str, where: str, depth: int) -> bool | None:
            if not depth:
                return True
            if name == ".":
                seen = self._marker(at, where, fresh and where == path)
            else:
                seen = self._marker_below(at, name, where) if below else None
                # Only a verdict that leaves the directory unwalked stands without opening
                # it: one that is walked is judged again through the descriptor it is
                # walked by, whatever was renamed into its place meanwhile.
                if seen is None or not (seen.hides or depth >= self.depth):
                    return None
            if seen.res is not None:
                found[where] = seen.res
            return not seen.hides

        walk.walk_dirs(fd, path, depth, self.depth, visit, watch)
        return found

    def _marker(self, fd: int, path: str, fresh: bool) -> _Seen:
        """What the marker of directory `fd` (at `path`) is, if it has one."""
        try:
            pfd = fsops.pin(fd, MARKER)  # what is stat'ed is what is read
        except FileNotFoundError:
            self._forget(path)
            return _UNMARKED
        except OSError as err:
            return self._unsure(path, err)
        try:
            try:
                dst = os.fstat(fd)
            except OSError as err:
                return self._unsure(path, err)
            return self._pinned(pfd, dst, path, fresh)
        finally:
            os.close(pfd)

    def _marker_below(self, parent: int, name: str, path: str) -> _Seen | None:
        """What the marker of directory `name` in `parent` (at `path`) is, read without
        opening the directory; None when that cannot tell (the directory is not a plain
        one now, say), and it is to be opened and looked at as _marker does.

        The directory's stat comes from a second lookup of `name`, so it may be that of a
        directory renamed into its place meanwhile. It only says whether the marker is a
        valid claim: one its owner could make by writing the marker there, which hides
        only what the owner of that directory controls, and which removal, through
        descriptors, checks again."""
        try:
            pfd = fsops.pin_below(parent, name, MARKER)
        except FileNotFoundError:
            self._forget(path)
            return _UNMARKED
        except OSError:
            return None
        try:
            try:
                dst = os.stat(name, dir_fd=parent, follow_symlinks=False)
            except OSError:
                return None
            return self._pinned(pfd, dst, path, False) if stat.S_ISDIR(dst.st_mode) else None
        finally:
            os.close(pfd)

    def _pinned(self, pfd: int, dst: os.stat_result, path: str, fresh: bool) -> _Seen:
        """What the marker pinned by `pfd` is, in the directory of stat `dst` at `path`."""
        try:
            st = os.fstat(pfd)
        except OSError as err:
            return self._unsure(path, err)
        sig = (
            dst.st_uid,
            st.st_dev,
            st.st_ino,
            st.st_mode,
            st.st_nlink,
            st.st_uid,
            st.st_size,
            st.st_mtime_ns,
            st.st_ctime_ns,
        )
        old = self.markers.get(path) or self.previous.get(path)
        if old is None and self.known is not None:
            # Another thread's dict: one get() is atomic, and _Seen is immutable.
            old = self.known.markers.get(path)
        same = old is not None and old.sig == sig  # then what it says was said already
        if same and not old.racy:
            self.markers[path] = old
            return old
        racy = time.time_ns() - st.st_ctime_ns < RACY_NS
        said = old.said if same else None  # a racy reading's warning, if any
        try:
            owner = marker.read_pinned(pfd, st)
        except marker.MarkerError as err:
            self._looked(path, False)
            if fresh and stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
                # Made in place, it may still be being written: not wrong yet. Closing it
                # after writing brings it back (a hard link, with two, is already whole).
                self.markers[path] = _UNMARKED  # read again next time
                return _UNMARKED
            if str(err) != said:
                log.warning("marker %s %s; workdir skipped", _where(path), err)
            self.markers[path] = _Seen(sig, None, False, self._looked(path, racy), str(err))
            return self.markers[path]
        except OSError as err:
            return self._unsure(path, err)
        why = marker.claim(dst, st)
        if why is not None and why != said:
            # Indexed all the same, so that its owner's death leaves a refusal on record.
            log.warning(
                "marker %s %s: it is not removed, and workdirs below it are looked for",
                _where(path),
                why,
            )
        res = Resource(self.kind, path, owner, name=path)
        seen = _Seen(sig, res, why is None, self._looked(path, racy), why)
        self.markers[path] = seen
        return seen

    def _looked(self, path: str, racy: bool) -> bool:
        """The marker at `path` needs no second look, or (racy) one after RACY_NS; returns
        `racy`."""
        self.unsure.discard(path)
        self.transient.discard(path)
        if racy:
            self.racy.add(path)
        else:
            self.racy.discard(path)
        return racy

    def _unsure(self, path: str, err: OSError) -> _Seen:
        """The marker at `path` cannot be read now: what was known of it stands, and it is
        looked at again soon (see watch.py)."""
        if path not in self.unsure:
            log.warning(
                "marker %s is unreadable: %s; looked at again later",
                printable(os.path.join(path, MARKER)),
                err.strerror or err,
            )
        self.unsure.add(path)
        if err.errno in fsops.TRANSIENT:
            self.transient.add(path)
        old = self.markers.get(path) or self.previous.get(path)
        if old is None:
            return _UNMARKED
        self.markers[path] = old
        return old

    def _forget(self, path: str) -> None:
        self.markers.pop(path, None)
        self._looked(path, False)


def split(roots: Iterable[str], path: str) -> tuple[str, list[str]] | None:
    """The root `path` lies strictly below, and the components below it."""
    for root in roots:
        prefix = root.rstrip("/") + "/"
        if path.startswith(prefix):
            return root, path[len(prefix) :].split("/")
    return None
