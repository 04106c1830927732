"""Raw Linux file-system work for the workdir kind, all through file descriptors that
never follow a symlink or cross a mount: opening, walking, reading a small regular file,
emptying a directory.

Nothing here knows what a workdir or a marker is; workdirs/tree.py and workdirs/kind.py give
the calls meaning.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import logging
import os
import stat
import sys
from collections.abc import Callable, Iterator, Sequence

log = logging.getLogger(__name__)
_libc = ctypes.CDLL(None, use_errno=True)

# openat2(2) has the same number on every architecture.
_SYS_OPENAT2 = 437
RESOLVE_NO_XDEV = 0x01
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
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


_SUBDIR_HOW = _how(_DIR_FLAGS, RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV | RESOLVE_BENEATH)
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
        os.close(_openat2(-100, "/", _DIR_FLAGS, 0))  # AT_FDCWD
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
    return _subdir_opener()(dir_fd, name)


def _subdir_opener() -> Callable[[int, str], int]:
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
    fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    try:
        if os.fstat(fd).st_dev != os.fstat(dir_fd).st_dev or mount_id(fd) != mount_id(dir_fd):
            raise OSError(errno.EXDEV, os.strerror(errno.EXDEV), name)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_under(root: str, parts: Sequence[str]) -> int:
    """Open root/parts[0]/... one component at a time with open_dir. Raises OSError."""
    fd = os.open(root, _DIR_FLAGS)
    for part in parts:
        try:
            sub = open_dir(fd, part)
        finally:
            os.close(fd)
        fd = sub
    return fd


# visit(at, name, path, depth): the directory `name` in the open directory `at` ("." for
# `at` itself); True to walk below it, False (or None for ".") not to, and None for a
# subdirectory it cannot judge from its parent.
Visit = Callable[[int, str, str, int], bool | None]


def walk_dirs(
    fd: int,
    path: str,
    depth: int,
    limit: int,
    visit: Visit,
    watch: Callable[[int, str, int], None] | None = None,
) -> None:
    """Visit the open directory `fd`, which is `path` at `depth`, and its subdirectories
    down to depth `limit`, below those for which visit returns True. Closes `fd`.

    Without `watch`, a subdirectory is visited from its parent first. It is opened only
    when that visit returns None, and then visited as ".", open; or when it returns True,
    to be walked. Most workdirs are never opened: their marker says there is nothing to
    walk below them.
    With `watch`, each directory is opened and watched (watch(fd, path, depth)) before it
    is visited as "." and read, so nothing created meanwhile goes unseen.

    Symlinks, mount points and entries that vanish are skipped, and so, with a warning,
    is a directory that cannot be opened (EACCES from a FUSE mount of another user's,
    say). A TRANSIENT error (a full fd table) raises: what was not walked must not read
    as empty. At most one fd per level is open at a time.
    """
    open_subdir = _subdir_opener()
    # (fd, its path with a trailing slash, its depth, its entries still to look at)
    stack: list[tuple[int, str, int, Iterator[os.DirEntry[str]]]] = []
    try:
        if watch is not None:
            watch(fd, path, depth)
        below = visit(fd, ".", path, depth)
        while True:
            if below and depth < limit:
                prefix = path if path.endswith("/") else path + "/"
                stack.append((fd, prefix, depth, os.scandir(fd)))
            else:
                os.close(fd)
            fd = -1
            while stack and fd < 0:
                parent, prefix, pdepth, entries = stack[-1]
                for entry in entries:
                    # d_type from the listing: no stat for what is not a directory
                    if not entry.is_dir(follow_symlinks=False):
                        continue
                    path, depth = prefix + entry.name, pdepth + 1
                    below = None if watch is not None else visit(parent, entry.name, path, depth)
                    if below is False or (below and depth >= limit):
                        continue
                    try:
                        fd = open_subdir(parent, entry.name)
                    except OSError as err:
                        if err.errno in TRANSIENT:
                            raise
                        if err.errno not in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR, errno.EXDEV):
                            why = err.strerror
                            log.warning("cannot open directory %s: %s", printable(path), why)
                        continue
                    if below is None:
                        if watch is not None:
                            watch(fd, path, depth)
                        below = visit(fd, ".", path, depth)
                    break
                else:
                    entries.close()
                    os.close(parent)
                    stack.pop()
            if fd < 0:
                return
    finally:
        if fd >= 0:
            os.close(fd)
        for parent, _, _, entries in stack:
            entries.close()
            os.close(parent)


def printable(path: str) -> str:
    """`path` fit for a one-line message: as it is, or as repr() shows it when it holds
    control characters, other unprintable ones or undecodable bytes (users name paths)."""
    return path if path.isprintable() else repr(path)


def open_parent(fd: int) -> int:
    """Open '..' of `fd`. The caller must check it is the directory it came from."""
    # RESOLVE_BENEATH forbids '..', so this is a plain openat.
    return os.open("..", _DIR_FLAGS, dir_fd=fd)


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


Left = tuple[str, str, bool]  # path below the emptied directory, why it stayed, on purpose


def empty_dir(top: int, spare: Callable[[int], str | None], keep: str) -> list[Left]:
    """Remove everything below the open directory `top` except its entry `keep`.

    Never follows a symlink and never enters another mount; `spare(fd)` may keep a
    subdirectory by saying why (an OSError it raises leaves it too, to be tried again).
    Returns what was left. An explicit stack with one open fd at a time: going back up
    opens '..' and checks it is the directory we came from, so no depth exhausts the Python
    stack or the fd table. Each level keeps only its own name: a path is built for a
    message alone, so memory grows with the depth, not with its square.
    """
    left: list[Left] = []
    fd = os.dup(top)
    try:
        names = [n for n in os.listdir(fd) if n != keep]
        # (name of this level, its stat, entries still to do, len(left) on entering it)
        stack: list[tuple[str, os.stat_result, list[str], int]] = [("", os.fstat(fd), names, 0)]

        def rel(name: str | None = None) -> str:
            parts = [level[0] for level in stack[1:]]
            return "/".join(parts if name is None else [*parts, name])

        while stack:
            _, _, names, left_before = stack[-1]
            if names:
                name = names.pop()
                sub = _step(fd, name, functools.partial(rel, name), spare, left)
                if sub is not None:
                    os.close(fd)
                    fd = sub[0]
                    stack.append((name, sub[1], sub[2], len(left)))
                continue
            if len(stack) == 1:
                break
            up = open_parent(fd)
            ust, want = os.fstat(up), stack[-2][1]
            if (ust.st_dev, ust.st_ino) != (want.st_dev, want.st_ino):
                os.close(up)
                left.append((rel(), "it was moved away during removal; stopped there", True))
                break
            os.close(fd)
            fd = up
            name = stack[-1][0]
            try:
                os.rmdir(name, dir_fd=fd)
            except FileNotFoundError:
                pass
            except OSError as err:
                # Not empty because of something already reported: say it once.
                if err.errno != errno.ENOTEMPTY or len(left) == left_before:
                    left.append((rel(), err.strerror or str(err), False))
            stack.pop()
    finally:
        os.close(fd)
    return left


def _step(
    fd: int,
    name: str,
    rel: Callable[[], str],
    spare: Callable[[int], str | None],
    left: list[Left],
) -> tuple[int, os.stat_result, list[str]] | None:
    """Unlink entry `name` of `fd`, or open it when it is a directory to descend into;
    `rel()` is its path below the emptied directory, for messages."""
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        if not stat.S_ISDIR(st.st_mode):
            # Unlinking a symlink or a hard link never touches the target's content.
            os.unlink(name, dir_fd=fd)
            return None
        child = open_dir(fd, name)
    except FileNotFoundError:
        return None
    except OSError as err:
        if err.errno == errno.EXDEV:
            left.append((rel(), "a mount point or on another filesystem", True))
        elif err.errno in (errno.ELOOP, errno.ENOTDIR, errno.EISDIR):
            left.append((rel(), "it changed during removal", True))
        else:
            left.append((rel(), err.strerror or str(err), False))
        return None
    try:
        cst = os.fstat(child)
        if (cst.st_dev, cst.st_ino) != (st.st_dev, st.st_ino):
            left.append((rel(), "it changed during removal", True))
        elif (why := spare(child)) is not None:
            left.append((rel(), why, True))
        else:
            return child, cst, os.listdir(child)
    except OSError as err:
        left.append((rel(), err.strerror or str(err), False))
    os.close(child)
    return None
