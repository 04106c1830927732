"""inotify through ctypes: a tree of directories watched by path, each watch added through
the descriptor its directory was checked with."""

from __future__ import annotations

import ctypes
import errno
import os
import struct
from dataclasses import dataclass, field

_libc = ctypes.CDLL(None, use_errno=True)

IN_CLOSE_WRITE = 0x00000008
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_UNMOUNT = 0x00002000
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_EXCL_UNLINK = 0x04000000
IN_ISDIR = 0x40000000
# What a directory's watch reports: its entries created, moved or deleted, files closed after
# writing, and the directory itself going.
_WATCH = IN_CREATE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE | IN_CLOSE_WRITE
_WATCH |= IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR | IN_EXCL_UNLINK
_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of NUL-padded name
# Prototyped once: a walk adds 100,000 watches, and ctypes' per-call conversions of an
# unprototyped call cost more than the syscall.
_inotify_add_watch = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32, use_errno=True
)(("inotify_add_watch", _libc))


@dataclass
class Watched:
    wd: int
    depth: int  # levels below the root of the watched tree
    children: set[str] = field(default_factory=set)


class Inotify:
    """A non-blocking inotify instance that watches a tree of directories by path.

    Each directory is watched through the descriptor it was opened with, so the watch lands
    on the very directory that was checked, whatever happens to its path meanwhile.
    """

    def __init__(self) -> None:
        fd = _libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        self.fd: int = fd
        self.dirs: dict[str, Watched] = {}
        self._paths: dict[int, str] = {}  # wd -> directory

    def watch(self, fd: int, path: str, depth: int) -> None:
        """Watch the open directory `fd`, known as `path`, `depth` levels below the root of
        the tree. Raises OSError (ENOSPC: the watch limit is reached)."""
        wd = _inotify_add_watch(self.fd, f"/proc/self/fd/{fd}".encode(), _WATCH)
        if wd < 0:
            err = ctypes.get_errno()
            why = "inotify watch limit reached" if err == errno.ENOSPC else os.strerror(err)
            raise OSError(err, why, path)
        old = self.dirs.get(path)
        if old is None or old.wd != wd:
            if old is not None:
                self.unwatch(path)
            self.dirs[path] = Watched(wd, depth)
        parent = self.dirs.get(os.path.dirname(path)) if depth else None
        if parent is not None:
            parent.children.add(path)
        # The same directory seen under a newer path (a rename not yet reported) moves over.
        self._paths[wd] = path

    def unwatch(self, path: str) -> None:
        d = self.dirs.pop(path)
        parent = self.dirs.get(os.path.dirname(path))
        if parent is not None:
            parent.children.discard(path)
        if self._paths.get(d.wd) == path:
            del self._paths[d.wd]
            # EINVAL: the kernel already dropped the watch with its directory.
            _libc.inotify_rm_watch(self.fd, d.wd)

    def subtree(self, path: str) -> list[str]:
        """`path` and every directory watched below it."""
        out, todo = [], [path]
        while todo:
            p = todo.pop()
            if p in self.dirs:
                out.append(p)
                todo.extend(self.dirs[p].children)
        return out

    def path(self, wd: int) -> str | None:
        """The directory watched as `wd`, or None when it is no longer watched."""
        return self._paths.get(wd)

    def read(self) -> list[tuple[int, int, str]]:
        """The pending events as (wd, mask, name); [] when none are pending."""
        try:
            buf = os.read(self.fd, 64 * 1024)
        except BlockingIOError:
            return []
        events, off = [], 0
        while off < len(buf):
            wd, mask, _cookie, length = _EVENT.unpack_from(buf, off)
            off += _EVENT.size
            events.append((wd, mask, os.fsdecode(buf[off : off + length].rstrip(b"\0"))))
            off += length
        return events

    def close(self) -> None:
        os.close(self.fd)
