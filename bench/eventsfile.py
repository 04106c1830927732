"""When podman says a container is gone, by the kernel's clock: podman's events file
(`events_logger = "file"`), read as each line is written (inotify on its directory). Its
events API reads that same file by polling it, so a `remove` event reaches an API client
up to a quarter of a second late (in the smoke run every removal, ours and the floor's
alike, was seen 250 ms after it was asked for): too coarse a clock for a difference of a
few ms. The line itself is written when the removal is done."""

from __future__ import annotations

import ctypes
import json
import os
import select
import threading
import time

from bench.gone import IN_CLOEXEC, IN_NONBLOCK, Seen, _libc

IN_MODIFY, IN_CREATE, IN_MOVED_TO = 0x2, 0x100, 0x80


class EventsFile(Seen):
    """Follows podman's events file from now on; `when(id)` is when the line of `event` for
    container `id` was seen (monotonic). The file may be rotated (podman rewrites it past
    `events_logfile_max_size`): a new inode is read from its start, and an id keeps the
    time it was first seen."""

    def __init__(self, path: str, event: str = "remove") -> None:
        super().__init__()
        self.path, self.event = path, event
        self.fd = _libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        mask = IN_MODIFY | IN_CREATE | IN_MOVED_TO
        if _libc.inotify_add_watch(self.fd, os.fsencode(os.path.dirname(path)), mask) < 0:
            raise OSError(ctypes.get_errno(), f"inotify_add_watch {os.path.dirname(path)}")
        self._file = open(path, "rb")  # noqa: SIM115 (kept open while followed)
        self._file.seek(0, os.SEEK_END)
        self._partial = b""
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._follow, daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        while True:
            ready, _, _ = select.select([self.fd, self._wake_r], [], [])
            if self._wake_r in ready:
                return
            at = time.monotonic()
            try:
                while os.read(self.fd, 65536):  # what changed is read from the file itself
                    pass
            except BlockingIOError:
                pass
            self._read(at)

    def _read(self, at: float) -> None:
        try:
            ino = os.stat(self.path).st_ino
        except FileNotFoundError:
            return  # between a rotation's unlink and its rename: the next event reads it
        if ino != os.fstat(self._file.fileno()).st_ino:
            self._file.close()
            self._file = open(self.path, "rb")  # noqa: SIM115
            self._partial = b""
        lines = (self._partial + self._file.read()).split(b"\n")
        self._partial = lines.pop()  # a line not yet written whole
        with self._cond:
            for line in lines:
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if event.get("Type") == "container" and event.get("Status") == self.event:
                    self.seen.setdefault(event["ID"], at)
            self._cond.notify_all()

    def close(self) -> None:
        os.write(self._wake_w, b"x")
        self._thread.join()
        self._file.close()
        for fd in (self.fd, self._wake_r, self._wake_w):
            os.close(fd)
