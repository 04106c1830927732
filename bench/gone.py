"""When a directory is removed, by the kernel's clock: inotify IN_DELETE_SELF on the
directory itself, so neither side polls."""

from __future__ import annotations

import ctypes
import os
import select
import struct
import threading
import time
from collections.abc import Iterable

IN_DELETE_SELF = 0x400
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len

_libc = ctypes.CDLL(None, use_errno=True)


class Seen:
    """What was seen to go (a directory, a container), each with the monotonic time it was
    seen: the bench's clocks share this, and differ in what they follow."""

    def __init__(self) -> None:
        self.seen: dict[str, float] = {}
        self._cond = threading.Condition()

    def wait(self, keys: Iterable[str], timeout: float) -> bool:
        """Whether every one of `keys` was seen to go within `timeout` seconds from now."""
        keys = list(keys)
        with self._cond:
            return self._cond.wait_for(lambda: all(k in self.seen for k in keys), timeout)

    def when(self, key: str) -> float | None:
        with self._cond:
            return self.seen.get(key)


class Gone(Seen):
    """Watch directories; `when(path)` is the monotonic time each was removed."""

    def __init__(self) -> None:
        super().__init__()
        self.fd = _libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self._paths: dict[int, str] = {}
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._follow, daemon=True)
        self._thread.start()

    def add(self, path: str) -> None:
        wd = _libc.inotify_add_watch(self.fd, os.fsencode(path), IN_DELETE_SELF)
        if wd < 0:
            raise OSError(ctypes.get_errno(), f"inotify_add_watch {path}")
        with self._cond:
            self._paths[wd] = path

    def _follow(self) -> None:
        while True:
            ready, _, _ = select.select([self.fd, self._wake_r], [], [])
            if self._wake_r in ready:
                return
            at = time.monotonic()
            try:
                buf = os.read(self.fd, 65536)
            except BlockingIOError:
                continue
            off = 0
            with self._cond:
                while off < len(buf):
                    wd, mask, _, length = _EVENT.unpack_from(buf, off)
                    off += _EVENT.size + length
                    if mask & IN_DELETE_SELF and wd in self._paths:
                        self.seen[self._paths[wd]] = at
                self._cond.notify_all()

    def close(self) -> None:
        os.write(self._wake_w, b"x")
        self._thread.join()
        for fd in (self.fd, self._wake_r, self._wake_w):
            os.close(fd)
