"""Raw Linux file-system calls for work as root in directories that users control, all
through file descriptors that never follow a symlink or cross a mount: opening a
directory, pinning a file, reading a small regular one, naming what a mode is.

Nothing here knows what a workdir, a marker or a hook is; the kinds give the calls meaning
(workdirs/walk.py walks and empties trees with them).
"""

from __future__ import annotations

import ctypes
import errno
import functools
import logging
import os
import stat
import sys
from collections.abc import Callable, Sequence

log = logging.getLogger(__name__)
_libc = ctypes.CDLL(None, use_errno=True)

# openat2(2) has the same number on every architecture.
_SYS_OPENAT2 = 437
RESOLVE_NO_XDEV = 0x01
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# Errors that say "not now" (the fd table or memory is full), and nothing about the entry.
TRANSIENT = (errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS, errno.EAGAIN)


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


# Prototyped once: a walk calls it 100,000 times, and ctypes' per-call conversions of
# unprototyped calls cost more than the syscall. syscall() is variadic: every argument is
# declared at full register width.
_syscall4 = ctypes.CFUNCTYPE(
    ctypes.c_long,
    ctypes.c_long,
    ctypes.c_long,
    ctypes.c_char_p,
    ctypes.c_void_p,
    ctypes.c_size_t,
    use_errno=True,
)(("syscall", _libc))


@functools.cache
def _how(flags: int, resolve: int) -> _OpenHow:
    return _OpenHow(flags, 0, resolve)  # cached: kept alive for as long as it is passed


_SUBDIR_HOW = _how(DIR_FLAGS, RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV | RESOLVE_BENEATH)
_SUBDIR_HOW_AT = ctypes.addressof(_SUBDIR_HOW)
_HOW_SIZE = ctypes.sizeof(_OpenHow)
_FS_ENCODING = sys.getfilesystemencoding()  # what os.fsencode uses, looked up once
_FS_ERRORS = sys.getfilesystemencodeerrors()


def _openat2(dir_fd: int, name: str, flags: int, resolve: int) -> int:
    how = _how(flags, resolve)
    fd = _syscall4(
        _SYS_OPENAT2, dir_fd, os.fsencode(name), ctypes.addressof(how), ctypes.sizeof(how)
    )
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), name)
    return fd


@functools.cache
def have_openat2() -> bool:
    """Whether this kernel (and any seccomp filter in the way) allows openat2."""
    try:
        os.close(_openat2(-100, "/", DIR_FLAGS, 0))  # AT_FDCWD
    except OSError:
        return False
    return True


def mount_id(fd: int) -> int:
    """The id of the mount that `fd` lives on: it tells same-filesystem bind mounts apart."""
    with open(f"/proc/self/fdinfo/{fd}", encoding="ascii") as f:
        for line in f:
            if line.startswith("mnt_id:"):
                return int(line.split()[1])
    raise OSError(errno.ENOTSUP, "no mnt_id in /proc/self/fdinfo")


def open_dir(dir_fd: int, name: str) -> int:
    """Open the subdirectory `name` of `dir_fd`, refusing symlinks and mount crossings.

    Raises OSError: ELOOP or ENOTDIR for a symlink or a non-directory, EXDEV for a mount
    point or another filesystem (openat2 sees same-filesystem bind mounts too; the fallback
    compares st_dev and the mount id).
    """
    if "/" in name or name in ("", ".", ".."):
        raise OSError(errno.EINVAL, "not a single path component", name)
    return subdir_opener()(dir_fd, name)


def subdir_opener() -> Callable[[int, str], int]:
    """How to open a subdirectory by a name known to be one path component."""
    return _open_subdir2 if have_openat2() else _open_subdir


def _open_subdir2(dir_fd: int, name: str) -> int:
    return _openat2_at(dir_fd, name, _SUBDIR_HOW_AT)


def _openat2_at(dir_fd: int, path: str, how_at: int) -> int:
    """_openat2 unrolled, with `how_at` the address of an open_how made once: a walk
    makes this call 100,000 times. Raises OSError."""
    fd = _syscall4(_SYS_OPENAT2, dir_fd, path.encode(_FS_ENCODING, _FS_ERRORS), how_at, _HOW_SIZE)
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    return fd


def _open_subdir(dir_fd: int, name: str) -> int:
    fd = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    try:
        if os.fstat(fd).st_dev != os.fstat(dir_fd).st_dev or mount_id(fd) != mount_id(dir_fd):
            raise OSError(errno.EXDEV, os.strerror(errno.EXDEV), name)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_under(root: str, parts: Sequence[str]) -> int:
    """Open root/parts[0]/... one component at a time with open_dir. Raises OSError."""
    fd = os.open(root, DIR_FLAGS)
    for part in parts:
        try:
            sub = open_dir(fd, part)
        finally:
            os.close(fd)
        fd = sub
    return fd


def printable(path: str) -> str:
    """`path` fit for a one-line message: as it is, or as repr() shows it when it holds
    control characters, other unprintable ones or undecodable bytes (users name paths)."""
    return path if path.isprintable() else repr(path)


def file_type(mode: int) -> str:
    for test, name in (
        (stat.S_ISLNK, "a symlink"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return "of an unknown type"


class NotRegular(OSError):
    """The name is not a regular file; str() says what it is instead."""


_PIN_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
_PIN_BELOW_AT = ctypes.addressof(
    _how(_PIN_FLAGS, RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV | RESOLVE_BENEATH)
)
_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def pin(dir_fd: int, name: str) -> int:
    """An O_PATH descriptor of `name` in `dir_fd` (of the symlink itself, if it is one), to
    fstat and then read_pinned. O_PATH opens nothing: no FIFO blocks, no device driver runs.
    Raises OSError."""
    return os.open(name, _PIN_FLAGS, dir_fd=dir_fd)


def pin_below(dir_fd: int, sub: str, name: str) -> int:
    """pin() of `name` in the subdirectory `sub` of `dir_fd`, without opening `sub`: the
    path resolves beneath `dir_fd`, through no symlink and across no mount. Needs openat2
    (have_openat2()). Raises OSError: ELOOP, EXDEV or ENOTDIR when `sub` is not a plain
    subdirectory, ENOENT when either is missing."""
    return _openat2_at(dir_fd, f"{sub}/{name}", _PIN_BELOW_AT)


def read_pinned(pfd: int, st: os.stat_result, limit: int) -> bytes:
    """At most `limit` + 1 bytes of the file pinned by `pfd`, whose fstat is `st`.

    Raises NotRegular unless `st` is a regular file's; only then is it reopened for reading
    through /proc/self/fd, so a swap after the check cannot change what is read.
    """
    if not stat.S_ISREG(st.st_mode):
        raise NotRegular(f"is {file_type(st.st_mode)}, not a regular file")
    fd = os.open(f"/proc/self/fd/{pfd}", _READ_FLAGS)
    try:
        # All that fstat saw, in one read as a rule: no second read just to meet the end of
        # the file (a walk of 100,000 markers pays each syscall 100,000 times).
        data = os.read(fd, limit + 1)
        if not data or len(data) >= st.st_size or len(data) > limit:
            return data
        chunks, size = [data], len(data)
        while size <= limit:
            chunk = os.read(fd, limit + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size >= st.st_size:
                break
        return b"".join(chunks)
    finally:
        os.close(fd)
