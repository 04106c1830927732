"""The socket `exitwatch adopt` serves, and its file.

A container that bind-mounts a socket keeps the very file (inode) it saw when it started:
a socket unlinked and bound again under it is a dead end for that container for good. So
the file is never unlinked while anyone may use it. Under systemd the socket unit holds the
listening socket and passes it at every start (sd_listen_fds(3): LISTEN_PID, LISTEN_FDS,
the descriptors from 3 on), so one file serves across restarts and crashes; clients that
connect while the service is down wait in its backlog. Run by hand, a socket is bound only
where nothing is (bind(2) never replaces a file), and the path is left alone otherwise,
said in one line; one's own socket is unlinked at a clean stop.

The file never grants more than the engine's own socket does: it takes its owner, group
and mode (root:docker 0660 on Debian). Its directory must be one that nobody but root can
rename or replace anything in (proxy/safedir.py): else a user could put a socket of theirs
where root's clients would send it their secrets.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import stat
from collections.abc import MutableMapping
from dataclasses import dataclass

from exitwatch.engine.url import Endpoint
from exitwatch.proxy import safedir

SD_LISTEN_FDS_START = 3
BACKLOG = 4096  # clients queued while the service starts or restarts (somaxconn caps it)
MADE_MODE = 0o600  # a fresh socket's, until it takes the engine's


class ListenError(Exception):
    """The socket cannot be had; the message is one line."""


@dataclass
class Listening:
    sock: socket.socket
    path: str
    activated: bool  # systemd passed it: never ours to unlink
    ino: tuple[int, int]  # (st_dev, st_ino) of the file once set up

    def close(self) -> None:
        """Close it; a socket of one's own making is unlinked if the path is still it."""
        self.sock.close()
        if self.activated:
            return
        with contextlib.suppress(OSError):
            st = os.lstat(self.path)
            if stat.S_ISSOCK(st.st_mode) and (st.st_dev, st.st_ino) == self.ino:
                os.unlink(self.path)


def activated(env: MutableMapping[str, str]) -> socket.socket | None:
    """The listening socket systemd passed this process, or None; the variables that
    passed it are removed from `env` either way, as sd_listen_fds(1) does, so that no
    child takes them for its own. Raises ListenError for what is not one such socket."""
    pid, count = env.pop("LISTEN_PID", ""), env.pop("LISTEN_FDS", "")
    env.pop("LISTEN_FDNAMES", None)
    if not count or pid != str(os.getpid()):
        return None
    if count != "1":
        raise ListenError(
            f"systemd passed {count} sockets (LISTEN_FDS); exitwatch adopt serves exactly "
            "one: give exitwatch-adopt.socket a single ListenStream="
        )
    fd = SD_LISTEN_FDS_START
    try:
        os.set_inheritable(fd, False)
        sock = socket.socket(fileno=fd)
    except OSError as err:
        raise ListenError(f"the socket systemd passed (fd {fd}): {err.strerror}") from None
    listening = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
    if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM or not listening:
        sock.detach()
        raise ListenError(
            f"the socket systemd passed (fd {fd}) is not a listening unix stream socket"
        )
    return sock


def open_activated(sock: socket.socket) -> Listening:
    """The passed socket, with the path it is bound to (which must be a path)."""
    name = sock.getsockname()
    if not isinstance(name, str) or not name.startswith("/"):
        raise ListenError(f"the socket systemd passed is bound to {name!r}, not to a path")
    _checked_dir(name)
    st = os.lstat(name)
    return Listening(sock, name, True, (st.st_dev, st.st_ino))


def bind_fresh(path: str) -> Listening:
    """A socket bound at `path`, which must not exist, created MADE_MODE (root's alone)."""
    parent, name = os.path.split(path)
    if not name or name in (".", ".."):
        raise ListenError(f"cannot listen on {path}: not a file's path")
    base = _checked_dir(path, make=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    old = os.umask(0o777 & ~MADE_MODE)
    try:
        # Bound through the directory's descriptor: in it, whatever its path names by then.
        sock.bind(f"/proc/self/fd/{base.fd}/{name}")
        sock.listen(BACKLOG)
        st = os.stat(name, dir_fd=base.fd, follow_symlinks=False)
    except OSError as err:
        sock.close()
        if err.errno == errno.EADDRINUSE:
            raise ListenError(f"{path}: {_taken(path)}") from None
        raise ListenError(f"cannot listen on {path}: {err.strerror}") from None
    finally:
        os.umask(old)
        base.close()
    return Listening(sock, os.path.join(parent, name), False, (st.st_dev, st.st_ino))


def _taken(path: str) -> str:
    """What is at `path`, where a bind found something: it is left as it is."""
    try:
        st = os.lstat(path)
    except OSError:
        return "something was there a moment ago; left alone: try again"
    if not stat.S_ISSOCK(st.st_mode):
        return (
            "exists and is not a socket; left alone: move it away, or listen elsewhere (--listen)"
        )
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as probe:
        probe.settimeout(2.0)
        try:
            probe.connect(path)
        except OSError:
            return (
                "a socket nobody answers on (a stopped exitwatch adopt's?), left alone: "
                "containers that mount it hold that very file, which no new socket can "
                "replace for them. Remove it (rm) and restart them, or serve it with "
                "exitwatch-adopt.socket, which keeps one socket across restarts"
            )
    return (
        "a server already answers there (the engine? another exitwatch adopt?); left alone: "
        "stop it, or listen elsewhere (--listen)"
    )


def _checked_dir(path: str, make: bool = False) -> safedir.Base:
    """The directory of `path`, open, checked as the module says; made (0755) first if it
    is missing and `make`. Raises ListenError."""
    parent = os.path.dirname(path)
    try:
        try:
            return safedir.open_base(parent)
        except FileNotFoundError:
            if not make:
                raise
            above = safedir.open_base(os.path.dirname(parent))
            try:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(os.path.basename(parent), 0o755, dir_fd=above.fd)
            finally:
                above.close()
            return safedir.open_base(parent)
    except safedir.Unsafe as why:
        raise ListenError(
            f"not serving {path}: {why}, so another user could put a socket of theirs in its "
            "place: listen in a directory only root can write to"
        ) from None
    except OSError as err:
        raise ListenError(f"cannot listen on {path}: {parent}: {err.strerror}") from None


def align(listening: Listening, engine: Endpoint) -> str | None:
    """Give the socket file the engine socket's owner, group and mode, never more on the
    way: the mode both allow first, then the owner, then the engine's mode. What changed
    (one line), or None. A file that cannot be changed (a read-only /run, no CAP_CHOWN)
    is served as it is if it grants no more than the engine's. Raises ListenError when the
    file is no longer ours, or grants more and cannot be changed; OSError when the
    engine's socket cannot be looked at."""
    want = engine.stat()
    path = listening.path
    st = os.lstat(path)
    if not stat.S_ISSOCK(st.st_mode) or (st.st_dev, st.st_ino) != listening.ino:
        raise ListenError(f"{path} is no longer the socket being served: something replaced it")
    have_mode, want_mode = stat.S_IMODE(st.st_mode), stat.S_IMODE(want.st_mode) & 0o777
    have, wanted = (st.st_uid, st.st_gid, have_mode), (want.st_uid, want.st_gid, want_mode)
    if have == wanted:
        return None
    was = f"{st.st_uid}:{st.st_gid} {have_mode:04o}"
    try:
        os.chmod(path, have_mode & want_mode)
        os.chown(path, want.st_uid, want.st_gid, follow_symlinks=False)
        os.chmod(path, want_mode)
    except OSError as err:
        st = os.lstat(path)
        if _wider(st, want):
            raise ListenError(
                f"{path} ({st.st_uid}:{st.st_gid} {stat.S_IMODE(st.st_mode):04o}) lets in more "
                f"than the engine's {engine.where} ({want.st_uid}:{want.st_gid} {want_mode:04o}), "
                f"and cannot be given its owner and mode: {err.strerror or err}"
            ) from None
        return f"{path} is kept as it is ({was}), no wider than the engine's: {err.strerror}"
    now = f"{want.st_uid}:{want.st_gid} {want_mode:04o}"
    return f"{path} now {now} as the engine's {engine.where} (was {was})"


def _wider(st: os.stat_result, want: os.stat_result) -> bool:
    """Whether the file `st` lets some user in that the file `want` does not (root aside:
    it may connect to either). Each class of `st`'s bits must be within the bits `want`
    gives that same user: its owner's if the owner is the same, its group's if the group
    is, its others' otherwise."""
    mode, other = stat.S_IMODE(st.st_mode), want.st_mode & 0o007
    owner = (want.st_mode >> 6) & 0o7 if st.st_uid == want.st_uid else other
    group = (want.st_mode >> 3) & 0o7 if st.st_gid == want.st_gid else other
    return bool((mode >> 6) & 0o7 & ~owner or (mode >> 3) & 0o7 & ~group or mode & 0o007 & ~other)
