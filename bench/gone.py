"""When a directory is removed, by the kernel's clock: inotify IN_DELETE_SELF on the
directory itself, so neither side polls."""

from __future__ import annotations

import ctypes
import os
import select
import struct
import threading
import time

IN_DELETE_SELF = 0x400
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len

_libc = ctypes.CDLL(None, use_errno=True)


class Gone:
    """Watch directories; `when(path)` is the monotonic time each was removed."""

    def __init__(self) -> None:
        self.fd = _libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self._paths: dict[int, str] = {}
        self.seen: dict[str, float] = {}
        self._cond = threading.Condition()
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

    def wait(self, paths: list[str], timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: all(p in self.seen for p in paths), timeout)

    def when(self, path: str) -> float | None:
        with self._cond:
            return self.seen.get(path)

    def close(self) -> None:
        os.write(self._wake_w, b"x")
        self._thread.join()
        for fd in (self.fd, self._wake_r, self._wake_w):
            os.close(fd)
