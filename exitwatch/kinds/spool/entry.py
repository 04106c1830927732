"""An entry of a spool (a hook, a lease, a watchdog): its directory and its file, read
without following a link or blocking on a FIFO; the checks they must pass to be acted on
(made again through the same descriptors just before); and the spool they live in.

An entry is `<spool>/<id>/<format's file>`, e.g. `hooks/<id>/hook.json`. It acts as the
owner of its directory, and only if that user owns the file too: docs/design.md ("On-death
hooks") says why. What differs between the spools is their Format.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import pwd
import shlex
import stat
from collections.abc import Callable
from dataclasses import dataclass

from exitwatch.contract import HOOK_MAX_BYTES, is_hook_id, nests_too_deeply, open_spool
from exitwatch.kinds import fsops
from exitwatch.kinds.base import Resource
from exitwatch.kinds.fsops import printable
from exitwatch.owner import Owner, OwnerError

SPOOL_MODE = 0o1733
_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_PIN = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class Format:
    """What one spool holds: the noun its lines use ("hook"), the one file of each entry's
    directory, the check of that file's decoded JSON (None when it has the right shape),
    and how an entry is shown to people (from its id and its body)."""

    noun: str
    file: str
    problem: Callable[[object], str | None]
    show: Callable[[str, dict], str] = lambda name, body: f"{name}: {shlex.join(body['argv'])}"
    unusable: str = "none is followed"  # what a spool that cannot be used means: "no hook runs"
    # What the index keeps of an entry's body, beside its name (Entry.detail): a lease's
    # interval, a watchdog's timeout. A change of it is a change of the entry.
    keep: Callable[[dict], tuple] = lambda body: ()


class EntryError(ValueError):
    """An entry that is refused; the message says why. `lasting` is False where a later
    look may find it good although nothing changed (a user database that failed to
    answer, for one)."""

    def __init__(self, why: str, lasting: bool = True) -> None:
        super().__init__(why)
        self.lasting = lasting


@dataclass(frozen=True)
class Entry(Resource):
    """An entry as it was found: who owns it, and which directory and file it was. What it
    does is read again from the file when it acts; the index keeps only `name` (its id
    and, for a hook, the start of its command), for people."""

    uid: int = -1
    ino: int = 0  # of its file
    dev: int = 0
    dir_ino: int = 0
    detail: tuple = ()  # what its Format keeps of its body


@dataclass
class Opened:
    """An entry read from the spool, with the descriptors of its directory and its file
    (held while it acts: the file's lock, and the last checks, go through them)."""

    entry: Entry
    body: dict
    dir_fd: int
    fd: int

    def close(self) -> None:
        os.close(self.fd)
        os.close(self.dir_fd)


def entry_problem(name: str, st: os.stat_result, noun: str = "hook") -> str | None:
    """Why the spool entry `name` (its lstat or fstat `st`) is no `noun`'s directory, or
    None: what can be told without reading anything, so that it costs no more than the
    listing."""
    if stat.S_ISLNK(st.st_mode):
        return "it is a symlink"
    if noun == "hook" and stat.S_ISREG(st.st_mode) and name.endswith(".json"):
        # A rename keeps a file's owner: nothing in a file says who put it in the spool.
        return (
            "it is a hook file directly in the spool (the layout before hook directories), "
            "which never runs: register the hook again"
        )
    if not stat.S_ISDIR(st.st_mode):
        return f"it is {fsops.file_type(st.st_mode)}, not a {noun}'s directory"
    if not is_hook_id(name):
        return f"its name is not a {noun} id (32 hex digits)"
    if st.st_mode & 0o022:
        mode = stat.S_IMODE(st.st_mode)
        return f"its directory is writable by group or others (mode {mode:04o})"
    return None


def read_entry(fmt: Format, kind: str, spool_fd: int, name: str) -> Opened:
    """The entry in directory `name` of the spool, opened, a resource of `kind`. Raises
    FileNotFoundError when it is gone (or its directory holds no file of `fmt`: being
    removed, or cancelled), and EntryError when it is refused."""
    try:
        pin = os.open(name, _PIN, dir_fd=spool_fd)
    except FileNotFoundError:
        raise
    except OSError as err:
        raise _unopened("it", err) from None
    try:
        st = os.fstat(pin)
        problem = entry_problem(name, st, fmt.noun)
        if problem is not None:
            raise EntryError(problem)
        _on_spool_mount(pin, spool_fd, "its directory")
        # The very directory just checked, opened to be read.
        try:
            dir_fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=pin)
        except OSError as err:
            raise _unopened("it", err) from None
    finally:
        os.close(pin)
    try:
        fd = _open_file(fmt, dir_fd)
    except BaseException:
        os.close(dir_fd)
        raise
    try:
        file_st = check_file(fmt, fd, spool_fd, st)
        body = _body(fmt, fd)
        try:
            owner = Owner.parse(body["owner"])
        except OwnerError as err:
            raise EntryError(f"it names a bad owner: {err}") from None
        try:
            pwd.getpwuid(st.st_uid)
        except KeyError:
            # Also what a user database that failed for a moment (NSS, LDAP) says.
            why = f"it belongs to uid {st.st_uid}, which has no passwd entry"
            raise EntryError(why, lasting=False) from None
    except BaseException:
        os.close(fd)
        os.close(dir_fd)
        raise
    shown = printable(fmt.show(name, body)[:200])
    entry = Entry(
        kind, name, owner, shown, None, st.st_uid, file_st.st_ino, st.st_dev, st.st_ino,
        fmt.keep(body),
    )  # fmt: skip
    return Opened(entry, body, dir_fd, fd)


def _open_file(fmt: Format, dir_fd: int) -> int:
    try:
        return os.open(fmt.file, _OPEN, dir_fd=dir_fd)
    except OSError as err:
        if err.errno == errno.ENOENT:
            raise
        if err.errno == errno.ELOOP:
            raise EntryError(f"its {fmt.file} is a symlink") from None
        raise _unopened(f"its {fmt.file}", err) from None


def _unopened(what: str, err: OSError) -> EntryError:
    """The refusal of what could not be opened: one that lasts until it changes, unless the
    error says "not now" (a full fd table, no memory), which may pass by itself. A socket
    or a device named as a hook (ENXIO, ENODEV) is a user's choice, and stays one."""
    transient = err.errno in fsops.TRANSIENT
    return EntryError(f"{what} cannot be opened: {err.strerror}", lasting=not transient)


def _body(fmt: Format, fd: int) -> dict:
    data = b""
    while len(data) <= HOOK_MAX_BYTES and (chunk := os.read(fd, HOOK_MAX_BYTES + 1)):
        data += chunk
    if len(data) > HOOK_MAX_BYTES:
        raise EntryError(f"it is larger than {HOOK_MAX_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise EntryError("it is not UTF-8 JSON") from None
    if nests_too_deeply(text):
        raise EntryError("it is JSON nested too deeply")
    try:
        body = json.loads(text)
    except ValueError:
        raise EntryError("it is not UTF-8 JSON") from None
    problem = fmt.problem(body)
    if problem is not None:
        raise EntryError(problem)
    return body


def _on_spool_mount(fd: int, spool_fd: int, what: str) -> None:
    """EntryError unless `fd` lies on the spool's own mount.

    A file or directory mounted over (a user's FUSE mount on their own hook, a bind
    mount) is answered for by whoever serves that mount, root's fstat included: uid 0, one
    link, mode 0600 would all be the mount's word. So it must lie on the spool's own
    mount: the same device, and the same mount id (which a bind mount from the spool's
    own filesystem changes while the device stays).
    """
    if os.fstat(fd).st_dev != os.fstat(spool_fd).st_dev or (
        fsops.mount_id(fd) != fsops.mount_id(spool_fd)
    ):
        raise EntryError(f"{what} is mounted over: not on the spool's own filesystem")


def check_file(fmt: Format, fd: int, spool_fd: int, dir_st: os.stat_result) -> os.stat_result:
    """The stat of an open entry's file, whose directory's stat is `dir_st`, or EntryError
    for one that must not be acted on."""
    _on_spool_mount(fd, spool_fd, "it")
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise EntryError(f"its {fmt.file} is {fsops.file_type(st.st_mode)}, not a regular file")
    if st.st_nlink != 1:
        raise EntryError(f"its {fmt.file} has {st.st_nlink} links, not 1")
    if st.st_mode & 0o022:
        mode = stat.S_IMODE(st.st_mode)
        raise EntryError(f"its {fmt.file} is writable by group or others (mode {mode:04o})")
    if st.st_uid != dir_st.st_uid:
        # Moved in by the directory's owner: it says nothing of who wrote it.
        raise EntryError(
            f"its {fmt.file} belongs to uid {st.st_uid}, not to uid {dir_st.st_uid}, "
            "who owns its directory"
        )
    return st


def check_again(fmt: Format, opened: Opened, spool_fd: int) -> None:
    """The last look before an entry acts, through its descriptors: the directory and the
    file read are the ones checked, and they still pass. Raises EntryError."""
    dir_st = os.fstat(opened.dir_fd)
    problem = entry_problem(opened.entry.key, dir_st, fmt.noun)
    if problem is not None:
        raise EntryError(problem)
    _on_spool_mount(opened.dir_fd, spool_fd, "its directory")
    st = check_file(fmt, opened.fd, spool_fd, dir_st)
    entry = opened.entry
    if (dir_st.st_ino, dir_st.st_uid, st.st_ino) != (entry.dir_ino, entry.uid, entry.ino):
        raise EntryError("it changed while being read")


def ensure_spool(path: str) -> None:
    """Create the spool (root's, mode 1733) if it is missing; raise EntryError for one that
    others could tamper with."""
    parent = os.path.dirname(path)
    if not os.path.isdir(parent):
        os.makedirs(parent, mode=0o755, exist_ok=True)
        os.chmod(parent, 0o755)  # users must reach the spool, whatever the umask (0077 in the unit)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
        os.chmod(path, SPOOL_MODE)  # past the umask
    os.close(spool_fd(path))


def spool_fd(path: str) -> int:
    """The spool, opened to be listed, as on_death opens it (contract.open_spool). Raises
    EntryError for one that others could tamper with, OSError when it cannot be opened."""
    try:
        return open_spool(path, readable=True)
    except PermissionError as err:
        if err.errno != errno.EPERM:
            raise
        raise EntryError(err.strerror) from None


def remove_entry(fmt: Format, spool_fd: int, opened: Opened) -> None:
    """Remove an entry that is done (a hook that ran, a dead owner's lease): its file, if
    its name still leads to it, then its directory if its name still leads to it and it is
    empty now (its owner may have put a new entry in its place meanwhile, which is theirs
    to keep). Raises OSError."""
    entry = opened.entry
    with contextlib.suppress(FileNotFoundError):
        st = os.stat(fmt.file, dir_fd=opened.dir_fd, follow_symlinks=False)
        if (st.st_dev, st.st_ino) == (entry.dev, entry.ino):
            os.unlink(fmt.file, dir_fd=opened.dir_fd)
    with contextlib.suppress(FileNotFoundError):
        st = os.stat(entry.key, dir_fd=spool_fd, follow_symlinks=False)
        if (st.st_dev, st.st_ino) == (entry.dev, entry.dir_ino):
            try:
                os.rmdir(entry.key, dir_fd=spool_fd)
            except OSError as err:
                if err.errno != errno.ENOTEMPTY:
                    raise
