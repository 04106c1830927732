"""The run's directories (its socket's and CMD's TMPDIR): where they may go, and making and
removing them through descriptors held from the check on.

Root's run may be given a user's XDG_RUNTIME_DIR and TMPDIR (`su` without `-`), and a user
who can rename what the run makes there can put a directory of theirs in its place: root's
client then talks to the user's socket, root's CMD writes into the user's files. So a base
directory is used only when no other user can rename or replace anything on its path (the
rule is proxy/safedir.py's, which `exitwatch adopt`'s socket follows too). Otherwise `/tmp`,
checked the same way.

The directories are made through the base's descriptor; the socket is bound, the marker
written and the directory removed through the directory's own, and removal refuses a
directory put in its place. Paths go only to CMD, whose clients connect by path: on such a
base nobody else can change what they name.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass

from exitwatch.contract import mark_workdir
from exitwatch.kinds import fsops
from exitwatch.kinds.base import Outcome
from exitwatch.owner import Owner
from exitwatch.proxy.safedir import Base, Unsafe, open_base

FALLBACK = "/tmp"
PREFIX = "exitwatch-run-"
ATTEMPTS = 100  # names tried for a fresh directory, as tempfile.TMP_MAX
# Room for "/exitwatch-run-XXXXXXXX/docker.sock" within sun_path's 108 bytes.
SOCKET_BASE_MAX = 60
HAZARD = "another user could rename or replace what the run makes there"


class NoPlace(Exception):
    """No directory for the run's own; the message is one line."""


@dataclass
class Made:
    """A directory the run made, open, with its parent open too (until removed)."""

    parent: int
    name: str
    fd: int
    path: str


@dataclass
class Bases:
    """Where the run's directories go: the socket's, and CMD's TMPDIR (None: no TMPDIR of
    the run's); `notes` are the one-line reasons a directory named was not used."""

    socket: Base
    tmpdir: Base | None
    notes: list[str]

    def close(self) -> None:
        for fd in {self.socket.fd, *([self.tmpdir.fd] if self.tmpdir else [])}:
            os.close(fd)


def pick(env: Mapping[str, str], tmpdir: bool) -> Bases:
    """The bases for the socket (XDG_RUNTIME_DIR when it is short enough) and, if `tmpdir`,
    for CMD's TMPDIR (TMPDIR), each checked, or /tmp instead. An XDG_RUNTIME_DIR that is
    unset, relative or missing is passed over in silence, one that is not safe with a note.
    Raises NoPlace when TMPDIR cannot be opened, or when /tmp is needed and not safe."""
    refused: dict[str, tuple[list[str], str]] = {}  # path -> its variables, why not
    missing: list[str] = []  # notes of a TMPDIR that cannot be opened
    opened: list[Base] = []
    try:
        socket_base = tmp_base = None
        xdg = env.get("XDG_RUNTIME_DIR", "")
        if xdg.startswith("/"):
            with contextlib.suppress(OSError):
                socket_base = _checked(xdg, "XDG_RUNTIME_DIR", refused, opened)
            if socket_base is not None and len(os.fsencode(socket_base.path)) >= SOCKET_BASE_MAX:
                socket_base = None
        if tmpdir:
            given = env.get("TMPDIR") or FALLBACK
            try:
                tmp_base = _checked(given, "TMPDIR", refused, opened)
            except OSError as err:
                # Gone, or made a file: whoever could do that to root's TMPDIR must not be
                # able to stop root's run from starting.
                if given == FALLBACK:
                    raise NoPlace(
                        f"cannot make the run's directory in {given}: {err.strerror}"
                    ) from None
                missing.append(f"not using {given} (TMPDIR): {err.strerror}; using {FALLBACK}")
        if socket_base is None or (tmpdir and tmp_base is None):
            try:
                opened.append(open_base(FALLBACK))
            except (Unsafe, OSError) as err:
                raise NoPlace(f"no directory for the run's own: {FALLBACK}: {_why(err)}") from None
            socket_base = socket_base or opened[-1]
            tmp_base = tmp_base or (opened[-1] if tmpdir else None)
    except BaseException:
        for base in opened:
            base.close()
        raise
    for base in opened:
        if base not in (socket_base, tmp_base):
            base.close()
    notes = [
        f"not using {path} ({' and '.join(names)}): {why}, so {HAZARD}; using {FALLBACK}"
        for path, (names, why) in refused.items()
    ] + missing
    return Bases(socket_base, tmp_base, notes)


def _checked(
    path: str, name: str, refused: dict[str, tuple[list[str], str]], opened: list[Base]
) -> Base | None:
    """open_base(path), added to `opened`; None when it is not safe, said in `refused`.
    Raises OSError."""
    try:
        base = open_base(path if path.startswith("/") else os.path.join(os.getcwd(), path))
    except Unsafe as why:
        refused.setdefault(path, ([], str(why)))[0].append(name)
        return None
    opened.append(base)
    return base


def _why(err: Exception) -> str:
    return err.strerror if isinstance(err, OSError) and err.strerror else str(err)


def make(base: Base, owner: Owner) -> Made:
    """A fresh 0700 directory in `base`, marked with `owner`. Raises OSError."""
    for _ in range(ATTEMPTS):
        name = PREFIX + secrets.token_hex(4)
        try:
            os.mkdir(name, 0o700, dir_fd=base.fd)
        except FileExistsError:
            continue
        parent = os.dup(base.fd)
        try:
            # Past the umask, before it is opened (a umask of 0777 leaves it 0000). By name:
            # on a safe base nobody else may replace it meanwhile.
            os.chmod(name, 0o700, dir_fd=parent)
            fd = fsops.open_dir(parent, name)
        except BaseException:
            with contextlib.suppress(OSError):  # nothing in it yet
                os.rmdir(name, dir_fd=parent)
            os.close(parent)
            raise
        try:
            mark_workdir(fd, owner.pid)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):  # unmarked, the removal code would refuse it
                os.rmdir(name, dir_fd=parent)
            os.close(parent)
            raise
        return Made(parent, name, fd, os.path.join(base.path, name))
    raise FileExistsError(errno.EEXIST, "no free name for the run's directory", base.path)


def remove(made: Made, owner: Owner) -> Outcome:
    """Remove `made` with the workdir kind's checks, through its descriptors, then close
    them; the outcome says what was left."""
    from exitwatch.kinds.workdirs.kind import remove_made  # 20 ms: paid at the end, not the start

    try:
        return remove_made(owner, made.parent, made.name, made.fd, made.path)
    finally:
        os.close(made.fd)
        os.close(made.parent)
