"""A directory that no other user can rename or replace anything in: where a socket may be
served, and where root may make what a user's client finds by its path.

Root's `exitwatch run` may be given a user's XDG_RUNTIME_DIR and TMPDIR (`su` without `-`),
and `exitwatch adopt` may be told to listen anywhere: a user who can rename what is made
there can put a directory or a socket of theirs in its place, and root's clients then talk
to the user's socket. So a directory is used only when every component of its path from `/`
down, a symlink included, belongs to root or to the caller, and each one that its group or
others may write to is sticky, as `/tmp` is (which keeps others from renaming what the
caller made in it). It is opened one component at a time, and what is made in it is made
through the descriptor held from the check on.
"""

from __future__ import annotations

import errno
import os
import pwd
import stat
from dataclasses import dataclass

from exitwatch.kinds import fsops

MAX_LINKS = 40  # symlinks followed on one path, as the kernel does


class Unsafe(Exception):
    """Another user could rename or replace what is made in the directory; says why."""


@dataclass(eq=False)  # told apart by identity: each holds a descriptor of its own
class Base:
    """A directory that passed the check, open; `path` has no symlink, `.` or `..`."""

    path: str
    fd: int

    def close(self) -> None:
        os.close(self.fd)


def open_base(path: str) -> Base:
    """Open the absolute `path` one component at a time, checking each (see the module's
    note) and following a symlink only when it passes too. Raises Unsafe, or OSError when
    a component cannot be opened or is not a directory."""
    allowed = {0, os.geteuid()}
    todo = [p for p in reversed(path.split("/")) if p]  # components still to walk, last first
    stack = [(os.open("/", fsops.DIR_FLAGS), "")]  # (fd, name) of "/" and each below it
    links = 0
    try:
        _check(os.fstat(stack[0][0]), "/", allowed)
        while todo:
            name = todo.pop()
            if name == "." or (name == ".." and len(stack) == 1):
                continue
            if name == "..":
                os.close(stack.pop()[0])
                continue
            at, where = stack[-1][0], "/".join([n for _, n in stack] + [name])
            st = os.stat(name, dir_fd=at, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                # Its directory passed: only root or the caller can have put it there.
                if st.st_uid not in allowed:
                    raise Unsafe(f"{fsops.printable(where)} is a symlink of {_who(st.st_uid)}")
                links += 1
                if links > MAX_LINKS:
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)
                target = os.readlink(name, dir_fd=at)
                if target.startswith("/"):
                    while len(stack) > 1:
                        os.close(stack.pop()[0])
                todo += [p for p in reversed(target.split("/")) if p]
                continue
            stack.append((os.open(name, fsops.DIR_FLAGS, dir_fd=at), name))
            _check(os.fstat(stack[-1][0]), where, allowed)
        names = [n for _, n in stack[1:]]
        fd = stack.pop()[0]  # the caller's now
        return Base("/" + "/".join(names), fd)
    finally:
        for fd, _ in stack:
            os.close(fd)


def _check(st: os.stat_result, where: str, allowed: set[int]) -> None:
    where = fsops.printable(where)
    if st.st_uid not in allowed:
        raise Unsafe(f"{where} is owned by {_who(st.st_uid)}")
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        mode = stat.S_IMODE(st.st_mode)
        raise Unsafe(f"{where} is writable by its group or others and not sticky (mode {mode:04o})")


def _who(uid: int) -> str:
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"
