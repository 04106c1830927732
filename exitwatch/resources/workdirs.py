"""Workdirs: directories under configured roots that hold an owner marker.

Discovery walks the roots and then follows them with inotify. Removal runs as root in
directories that users control, so it acts only through directory file descriptors that
were opened without following symlinks or crossing mounts, and checks again before acting.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import logging
import os
import select
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from exitwatch.contract import MARKER, MARKER_MAX_BYTES
from exitwatch.owner import Owner, OwnerError
from exitwatch.resources import fsops
from exitwatch.resources.base import Found, Gone, Notify, Outcome, Resource, ResourceKind, Snapshot

log = logging.getLogger(__name__)

KIND = "workdir"
POLL_INTERVAL = 1.0  # seconds between rescans when inotify cannot be used
# Children of a dead owner may still be writing into its workdir: empty it this many times.
REMOVE_PASSES = 3
# Not IN_CREATE: a marker written in place is empty until IN_CLOSE_WRITE.
_MARKER_CHANGED = fsops.IN_MOVED_TO | fsops.IN_CLOSE_WRITE | fsops.IN_DELETE | fsops.IN_MOVED_FROM
_SELF_GONE = fsops.IN_DELETE_SELF | fsops.IN_MOVE_SELF | fsops.IN_UNMOUNT | fsops.IN_IGNORED

Watch = Callable[[int, str, int], None]


class MarkerError(ValueError):
    """A malformed marker; the message says what is wrong with it."""


def read_marker(dir_fd: int) -> tuple[Owner, os.stat_result]:
    """The owner the marker in directory `dir_fd` names, and the marker's stat.

    Raises FileNotFoundError when there is no marker, MarkerError when it is malformed.
    """
    try:
        data, st = fsops.read_regular(dir_fd, MARKER, MARKER_MAX_BYTES)
    except FileNotFoundError:
        raise
    except fsops.NotRegular as err:
        raise MarkerError(str(err)) from None
    except OSError as err:
        raise MarkerError(f"is unreadable: {err.strerror}") from None
    if len(data) > MARKER_MAX_BYTES:
        raise MarkerError(f"is larger than {MARKER_MAX_BYTES} bytes")
    try:
        body = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise MarkerError("is not UTF-8") from None
    except ValueError:
        raise MarkerError("is not JSON") from None
    if not isinstance(body, dict) or not isinstance(body.get("owner"), str):
        raise MarkerError('has no "owner" string')
    try:
        return Owner.parse(body["owner"]), st
    except OwnerError as err:
        raise MarkerError(f"names a bad owner: {err}") from None


class _Refused(Exception):
    """A safety check leaves the workdir alone; the message says why."""


class _Fallback(Exception):
    """inotify cannot follow the roots; the message says why."""


class _Overflow(Exception):
    """The inotify queue overflowed: changes were lost."""


@dataclass
class _Seen:
    """What one discovery thread remembers, so unchanged markers are not read or warned
    about again. A directory is marked while it has an entry in `markers`."""

    markers: dict[str, tuple[tuple[int, ...], Resource | None]] = field(default_factory=dict)
    previous: dict[str, tuple[tuple[int, ...], Resource | None]] = field(default_factory=dict)
    missing_roots: set[str] = field(default_factory=set)


class Workdirs(ResourceKind):
    kind = KIND

    def __init__(self, roots: Sequence[str] = ("/tmp", "/var/tmp"), depth: int = 3) -> None:
        if depth < 1:
            raise ValueError(f"depth must be at least 1, not {depth}")
        # Roots are the administrator's choice: resolve their symlinks once, so that every
        # path below them can be opened without following any.
        self.roots = tuple(dict.fromkeys(os.path.realpath(r) for r in roots))
        self.depth = depth
        self._thread: threading.Thread | None = None
        self._stop_r = self._stop_w = -1

    # Discovery

    def scan(self) -> Snapshot:
        found = self._walk_roots(_Seen(), None)
        return Snapshot(KIND, tuple(found[p] for p in sorted(found)))

    def start(self, notify: Notify) -> None:
        if self._thread is not None:
            raise RuntimeError("workdir discovery is already running")
        self._stop_r, self._stop_w = os.pipe()
        self._thread = threading.Thread(
            target=self._run, args=(notify,), name="exitwatch-workdirs", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        if self._thread is None:
            return
        os.write(self._stop_w, b"x")
        self._thread.join()
        os.close(self._stop_r)
        os.close(self._stop_w)
        self._thread = None

    def _run(self, notify: Notify) -> None:
        seen = _Seen()
        try:
            self._follow(notify, seen)
            return
        except _Fallback as err:
            reason = str(err)
        except OSError as err:
            reason = f"inotify failed: {err.strerror or err}"
        except Exception:
            log.exception("inotify workdir discovery failed")
            reason = "inotify discovery failed"
        log.warning("workdir discovery falls back to rescans every %gs: %s", POLL_INTERVAL, reason)
        self._poll(notify, seen)

    def _follow(self, notify: Notify, seen: _Seen) -> None:
        while True:  # one inotify instance per turn; an overflow starts afresh
            try:
                watcher = _Watcher(self, notify, seen)
            except OSError as err:
                raise _Fallback(f"inotify is unavailable: {err.strerror}") from None
            try:
                watcher.sync()
                log.info("following workdirs under %s with inotify", ", ".join(self.roots))
                while not self._wait(watcher.ino.fd, None):
                    for wd, mask, name in watcher.ino.read():
                        watcher.handle(wd, mask, name)
                return
            except _Overflow:
                log.warning("inotify queue overflowed: rescanning the workdir roots")
            finally:
                watcher.ino.close()

    def _poll(self, notify: Notify, seen: _Seen) -> None:
        known: dict[str, Resource] | None = None
        while True:
            try:
                found = self._walk_roots(seen, None)
            except OSError as err:
                log.warning("workdir rescan failed, trying again: %s", err)
            else:
                if known is None:
                    known = found
                    notify(Snapshot(KIND, tuple(found[p] for p in sorted(found))))
                else:
                    _report(notify, known, found, known.keys() | found.keys())
            if self._wait(None, POLL_INTERVAL):
                return

    def _wait(self, fd: int | None, timeout: float | None) -> bool:
        """Wait until `fd` is readable or `timeout` passes; True once stop() was called."""
        poller = select.poll()
        poller.register(self._stop_r, select.POLLIN)
        if fd is not None:
            poller.register(fd, select.POLLIN)
        ready = poller.poll(None if timeout is None else timeout * 1000)
        return any(r == self._stop_r for r, _ in ready)

    def _walk_roots(self, seen: _Seen, watch: Watch | None) -> dict[str, Resource]:
        seen.previous, seen.markers = seen.markers, {}
        found: dict[str, Resource] = {}
        for root in self.roots:
            try:
                fd = fsops.open_under(root, ())
            except OSError as err:
                if root not in seen.missing_roots:
                    log.warning("workdir root %s: %s; skipped", root, err.strerror)
                seen.missing_roots.add(root)
                continue
            seen.missing_roots.discard(root)
            found.update(self._walk(fd, root, 0, seen, watch))
        seen.previous = {}
        return found

    def _walk(
        self, fd: int, path: str, depth: int, seen: _Seen, watch: Watch | None
    ) -> dict[str, Resource]:
        """Workdirs at or below the open directory `fd`, which is `path`, `depth` levels
        below its root. Closes `fd`. With `watch`, each directory is watched before it is
        read, so nothing created meanwhile goes unseen."""
        found: dict[str, Resource] = {}

        def visit(fd: int, path: str, depth: int) -> bool:
            if watch is not None:
                watch(fd, path, depth)
            if not depth:
                return True
            marked, res = self._marker(fd, path, seen)
            if res is not None:
                found[path] = res
            return not marked

        fsops.walk_dirs(fd, path, depth, self.depth, visit)
        return found

    def _marker(self, fd: int, path: str, seen: _Seen) -> tuple[bool, Resource | None]:
        """Whether directory `fd` (at `path`) is marked, and the workdir if well marked."""
        try:
            st = os.stat(MARKER, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            seen.markers.pop(path, None)
            return False, None
        sig = (st.st_dev, st.st_ino, st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        old = seen.markers.get(path) or seen.previous.get(path)
        if old is not None and old[0] == sig:
            seen.markers[path] = old
            return True, old[1]
        try:
            res: Resource | None = Resource(KIND, path, read_marker(fd)[0], name=path)
        except FileNotFoundError:
            return False, None
        except MarkerError as err:
            log.warning("marker %s %s; workdir skipped", os.path.join(path, MARKER), err)
            res = None
        seen.markers[path] = (sig, res)
        return True, res

    def _split(self, path: str) -> tuple[str, list[str]] | None:
        """The root `path` lies strictly below, and the components below it."""
        for root in self.roots:
            prefix = root.rstrip("/") + "/"
            if path.startswith(prefix):
                return root, path[len(prefix) :].split("/")
        return None

    # Removal

    def remove(self, owner: Owner, resources: list[Resource], dry_run: bool) -> list[Outcome]:
        return [self._remove_one(owner, res.key, dry_run) for res in resources]

    def _remove_one(self, owner: Owner, path: str, dry_run: bool) -> Outcome:
        what = f"workdir {path}"
        try:
            root, parts = self._locate(path)
            try:
                parent = fsops.open_under(root, parts[:-1])
                try:
                    fd = fsops.open_dir(parent, parts[-1])
                except BaseException:
                    os.close(parent)
                    raise
            except OSError as err:
                if err.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise _Refused(
                        "it or a directory above it is a symlink or not a directory"
                    ) from None
                if err.errno == errno.EXDEV:
                    raise _Refused(
                        "it or a directory above it is a mount point or on another filesystem"
                    ) from None
                raise
            try:
                return self._remove_open(owner, what, parent, parts[-1], fd, dry_run)
            finally:
                os.close(fd)
                os.close(parent)
        except _Refused as why:
            log.warning("%s: refused to remove: %s", what, why)
            return Outcome(what, KIND, ok=False, detail=str(why), refused=True)
        except FileNotFoundError:
            log.info("%s: already gone", what)
            return Outcome(what, KIND, ok=True, detail="already gone")
        except OSError as err:
            log.warning("%s: removal failed: %s", what, err.strerror or err)
            return Outcome(what, KIND, ok=False, detail=f"failed: {err.strerror or err}")

    def _locate(self, path: str) -> tuple[str, list[str]]:
        if not os.path.isabs(path) or os.path.normpath(path) != path or "\0" in path:
            raise _Refused("the path is not absolute and normalized")
        if path in self.roots:
            raise _Refused("it is a workdir root, and a root is never removed")
        where = self._split(path)
        if where is None:
            raise _Refused(f"it is not under a workdir root ({', '.join(self.roots)})")
        if len(where[1]) > self.depth:
            raise _Refused(f"it is more than {self.depth} levels below {where[0]}")
        return where

    def _remove_open(
        self, owner: Owner, what: str, parent: int, name: str, fd: int, dry_run: bool
    ) -> Outcome:
        st = os.fstat(fd)
        try:
            marker_owner, mst = read_marker(fd)
        except FileNotFoundError:
            raise _Refused("it has no marker") from None
        except MarkerError as err:
            raise _Refused(f"its marker {err}") from None
        if marker_owner != owner:
            raise _Refused(f"its marker names owner {marker_owner}, not {owner}")
        # Anyone may write a marker into a directory they can write to, but only its owner
        # (or root) may claim it for removal.
        if mst.st_uid not in (st.st_uid, 0):
            raise _Refused(
                f"its marker belongs to uid {mst.st_uid}, the directory to uid {st.st_uid}"
            )
        # A hard link would let a marker root wrote for one directory claim another.
        if mst.st_nlink != 1:
            raise _Refused(f"its marker has {mst.st_nlink} hard links")
        if dry_run:
            log.info("%s: would remove (owner %s)", what, owner)
            return Outcome(what, KIND, ok=True, detail="would remove")
        left: list[fsops.Left] = []
        for _ in range(REMOVE_PASSES):
            left = fsops.empty_dir(fd, functools.partial(_foreign, owner=owner), MARKER)
            if any(kept for _, _, kept in left):
                break
            if left:
                continue
            # The marker goes last, so a workdir that could not be emptied is found again.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(MARKER, dir_fd=fd)
            if _rmdir_same(parent, name, st):
                log.info("%s: removed (owner %s)", what, owner)
                return Outcome(what, KIND, ok=True, detail="removed")
            left = [(".", "entries appeared during removal", False)]
        lines = [f"{rel}: {why}" for rel, why, _ in left]
        shown = "; ".join(lines[:5]) + (f"; and {len(lines) - 5} more" if len(lines) > 5 else "")
        log.warning("%s: left in place: %s", what, shown)
        kept = any(kept for _, _, kept in left)
        detail = f"left {len(lines)} entries: {shown}"
        return Outcome(what, KIND, ok=False, detail=detail, refused=kept, extra={"left": lines})


def _foreign(fd: int, owner: Owner) -> str | None:
    """Why a nested directory is not ours to remove: another owner marked it."""
    try:
        other = read_marker(fd)[0]
    except FileNotFoundError:
        return None
    except MarkerError as err:
        return f"it holds a marker that {err}"
    return None if other == owner else f"it holds the marker of another owner, {other}"


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


class _Watcher:
    """One inotify instance following the roots; used by the discovery thread alone.

    Every directory down to the depth limit is watched, a marked one too (to see its marker
    go), but nothing below a marked one. An event that matters makes the directory it
    concerns be looked at again.
    """

    def __init__(self, kind: Workdirs, notify: Notify, seen: _Seen) -> None:
        self.kind, self.notify, self.seen = kind, notify, seen
        self.ino = fsops.Inotify()
        self.known: dict[str, Resource] = {}
        self.visited: set[str] = set()

    def sync(self) -> None:
        """Watch everything, then report the complete set: nothing is lost in between."""
        self.known = self.kind._walk_roots(self.seen, self.watch)
        self.notify(Snapshot(KIND, tuple(self.known[p] for p in sorted(self.known))))

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
            if path in self.kind.roots:
                log.warning("workdir root %s was removed or moved away; no longer followed", path)
            self.refresh(path, depth)
        elif name == MARKER and depth:
            if mask & _MARKER_CHANGED:
                self.refresh(path, depth)
        elif mask & fsops.IN_ISDIR and depth < self.kind.depth and path not in self.seen.markers:
            self.refresh(os.path.join(path, name), depth + 1)

    def refresh(self, path: str, depth: int) -> None:
        """Look at `path` again: watch what is new below it, report what changed, and drop
        what is gone or now lies below a workdir."""
        before = self.ino.subtree(path)
        self.visited = set()
        found: dict[str, Resource] = {}
        where = self.kind._split(path)  # None for a root that went away
        try:
            fd = fsops.open_under(*where) if where else -1
        except OSError:  # gone, or no longer a plain directory
            fd = -1
        if fd >= 0:
            found = self.kind._walk(fd, path, depth, self.seen, self.watch)
        for p in before:
            if p not in self.visited:
                self.ino.unwatch(p)
                self.seen.markers.pop(p, None)
        _report(self.notify, self.known, found, set(before) | self.visited)


def _report(
    notify: Notify, known: dict[str, Resource], found: dict[str, Resource], paths: Iterable[str]
) -> None:
    """Report how `found` differs from `known` at `paths`, and bring `known` up to date."""
    for path in paths:
        res = found.get(path)
        if res is None:
            if known.pop(path, None) is not None:
                notify(Gone(KIND, path))
        elif known.get(path) != res:
            known[path] = res
            notify(Found(res))
