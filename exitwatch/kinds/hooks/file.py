"""A hook file: reading one without following a link or blocking on a FIFO, the checks it
must pass to run (made again through the same descriptor just before it runs), and the
spool it lives in."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import pwd
import shlex
import stat
from dataclasses import dataclass

from exitwatch.contract import HOOK_MAX_BYTES, HOOK_SUFFIX, hook_problem, spool_problem
from exitwatch.kinds import fsops
from exitwatch.kinds.base import Resource
from exitwatch.kinds.fsops import printable
from exitwatch.owner import Owner, OwnerError

KIND = "hook"
SPOOL_MODE = 0o1733
SPOOL_OPEN = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


class HookError(ValueError):
    """A hook file that is refused; the message says why. `lasting` is False where a later
    look may find it good although the file did not change (a user database that failed
    to answer, for one)."""

    def __init__(self, why: str, lasting: bool = True) -> None:
        super().__init__(why)
        self.lasting = lasting


@dataclass(frozen=True)
class Hook(Resource):
    """A hook file as it was found: who owns the file, and which file it was. What it runs
    is read again from the file when it runs; the index keeps only `name` (its id and
    the start of its command), for people."""

    uid: int = -1
    ino: int = 0
    dev: int = 0


def read_hook(dir_fd: int, name: str) -> tuple[Hook, dict, int]:
    """The hook in file `name` of the spool, its decoded body, and the file's descriptor
    (the caller closes it). Raises FileNotFoundError when it is gone, HookError when it
    is refused."""
    try:
        fd = os.open(name, _OPEN, dir_fd=dir_fd)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise HookError("it is a symlink") from None
        if err.errno == errno.ENOENT:
            raise
        raise HookError(f"it cannot be opened: {err.strerror}") from None
    try:
        st = check_file(fd, dir_fd)
        data = b""
        while len(data) <= HOOK_MAX_BYTES and (chunk := os.read(fd, HOOK_MAX_BYTES + 1)):
            data += chunk
        if len(data) > HOOK_MAX_BYTES:
            raise HookError(f"it is larger than {HOOK_MAX_BYTES} bytes")
        try:
            body = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            raise HookError("it is not UTF-8 JSON") from None
        problem = hook_problem(body)
        if problem is not None:
            raise HookError(problem)
        try:
            owner = Owner.parse(body["owner"])
        except OwnerError as err:
            raise HookError(f"it names a bad owner: {err}") from None
        try:
            pwd.getpwuid(st.st_uid)
        except KeyError:
            # Also what a user database that failed for a moment (NSS, LDAP) says.
            why = f"it belongs to uid {st.st_uid}, which has no passwd entry"
            raise HookError(why, lasting=False) from None
    except BaseException:
        os.close(fd)
        raise
    hook_id = name.removesuffix(HOOK_SUFFIX)
    shown = printable(f"{hook_id}: {shlex.join(body['argv'])}"[:200])
    hook = Hook(KIND, name, owner, shown, None, st.st_uid, st.st_ino, st.st_dev)
    return hook, body, fd


def check_file(fd: int, dir_fd: int) -> os.stat_result:
    """The stat of an open hook file of the spool `dir_fd`, or HookError for one that must
    not run.

    A file mounted over (a user's FUSE mount on their own hook file, a bind mount) is
    answered for by whoever serves that mount, root's fstat included: uid 0, one link,
    mode 0600 would all be the mount's word. So the file must lie on the spool's own
    mount: the same device, and the same mount id (which a bind mount of a file from the
    spool's own filesystem changes while the device stays).
    """
    st = os.fstat(fd)
    if st.st_dev != os.fstat(dir_fd).st_dev or fsops.mount_id(fd) != fsops.mount_id(dir_fd):
        raise HookError("it is mounted over: not on the spool's own filesystem")
    if not stat.S_ISREG(st.st_mode):
        raise HookError(f"it is {fsops.file_type(st.st_mode)}, not a regular file")
    if st.st_nlink != 1:
        raise HookError(f"it has {st.st_nlink} links, not 1")
    if st.st_mode & 0o022:
        raise HookError(f"it is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})")
    return st


def ensure_spool(path: str) -> None:
    """Create the spool (root's, mode 1733) if it is missing; raise HookError for one that
    others could tamper with."""
    parent = os.path.dirname(path)
    if not os.path.isdir(parent):
        os.makedirs(parent, mode=0o755, exist_ok=True)
        os.chmod(parent, 0o755)  # users must reach the spool, whatever the umask (0077 in the unit)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
        os.chmod(path, SPOOL_MODE)  # past the umask
    check_spool(path)


def check_spool(path: str) -> None:
    """HookError for a spool that others could tamper with (see spool_problem)."""
    problem = spool_problem(os.lstat(path))
    if problem is not None:
        raise HookError(problem)
