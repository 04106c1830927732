"""The status socket is born with its final mode: no window in which it has the looser one
the process umask gives, and so no chmod after bind (the kernel's inotify tells)."""

from __future__ import annotations

import ctypes
import os
import struct
from pathlib import Path

from exitwatch.service.status.server import SOCKET_MODE, StatusServer, query

IN_ATTRIB = 0x00000004
IN_CREATE = 0x00000100
_EVENT = struct.Struct("iIII")
_libc = ctypes.CDLL(None, use_errno=True)


def _events(fd: int) -> list[tuple[int, str]]:
    """(mask, name) of every event queued on the inotify `fd`."""
    try:
        data = os.read(fd, 65536)
    except BlockingIOError:
        return []
    out, at = [], 0
    while at < len(data):
        _, mask, _, size = _EVENT.unpack_from(data, at)
        at += _EVENT.size
        out.append((mask, data[at : at + size].rstrip(b"\0").decode()))
        at += size
    return out


def test_socket_is_created_with_its_final_mode_not_chmodded(tmp_path: Path) -> None:
    fd = _libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    assert fd >= 0, os.strerror(ctypes.get_errno())
    path = tmp_path / "status.sock"
    old = os.umask(0)  # the loosest: a bind alone would make the socket 0777
    try:
        assert _libc.inotify_add_watch(fd, bytes(tmp_path), IN_ATTRIB | IN_CREATE) >= 0
        server = StatusServer(str(path), lambda: {"ok": True})
    finally:
        os.umask(old)
    try:
        assert os.stat(path).st_mode & 0o777 == SOCKET_MODE
        assert os.umask(old) == old  # the umask is given back
        events = _events(fd)
        assert (IN_CREATE, path.name) in events, events
        assert not [e for e in events if e[0] & IN_ATTRIB], f"chmod after bind: {events}"
        assert query(str(path)) == {"ok": True}
    finally:
        server.close()
        os.close(fd)
