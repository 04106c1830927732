"""Which engine a URL names, and how to reach it: one reading for the agent, `exitwatch run`
and `exitwatch adopt`, so that all three speak to the same engine for the same settings
and DOCKER_HOST. Light to import: `exitwatch run` reads it at its start.

The rules, decided here alone:
- Only unix:// is spoken to. Owners are processes of this host, and an engine at tcp:// or
  ssh:// is another host's (and would need TLS or a tunnel that the proxy would have to
  terminate and speak again): the exitwatch of that host follows it.
- As docker-py has it, unix://var/run/docker.sock is /var/run/docker.sock.
- A setting given wins; else DOCKER_HOST, as the docker CLI reads it; else DEFAULT_URL.
- A podman service is named by CONTAINER_HOST, as podman's CLI reads it (podman()): set,
  it makes the CLI remote, speaking podman's own API to that socket; unset, the CLI works
  on its storage directly, through no socket at all.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_URL = "unix:///var/run/docker.sock"
RUN_USER = "/run/user"  # where each user's runtime directory is, /run/user/UID
ENV = "DOCKER_HOST"
SCHEME = "unix"
# What an engine URL must be, in the words of every error about one (config's checks too).
EXPECTED = (
    f"a local engine's unix:// socket (owners are processes of this host), such as "
    f"{DEFAULT_URL}; an engine reached by tcp:// or ssh:// is another host's, and is "
    "followed by the exitwatch of that host"
)


# What a URL taken from the environment adds to its error: where it came from, and what to do.
FROM_ENV = f" (from {ENV}: unset it, or point it at the engine's unix:// socket)"
PODMAN_ENV = "CONTAINER_HOST"
FROM_PODMAN_ENV = f" (from {PODMAN_ENV}: unset it, or point it at podman's unix:// socket)"


class EndpointError(ValueError):
    """A URL that names no engine exitwatch speaks to; one line: what it expected, and the
    URL given. Callers put first where the URL came from (a setting, DOCKER_HOST)."""

    def __init__(self, url: str, whence: str = "") -> None:
        super().__init__(f"expected {EXPECTED}, got {url!r}{whence}")
        self.url = url


@dataclass(frozen=True)
class Endpoint:
    """One engine: `url` as it was given (what status and messages show), and where it
    listens. Nothing outside this package needs to know that it is a socket file.

    `owner`: set for an engine found on the host rather than given by root (a user's
    rootless engine under /run/user/UID): the uid its socket must belong to. Such a socket
    is reached without following any symlink, through directories that none but root and
    that user may change, and only while it is a socket of that user; else connect()
    refuses. A user may point a symlink at any socket, root's engine's included, and have
    the agent act there on the user's word."""

    url: str
    _path: str
    owner: int | None = None

    @classmethod
    def owned(cls, path: str, uid: int) -> Endpoint:
        """The engine whose socket is `path` (absolute), reached only as `uid`'s."""
        return cls(served(path), path, uid)

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        """Raises EndpointError for a URL that is not a unix:// socket's. A socket in a
        user's runtime directory (/run/user/UID/...) is reached as that user's alone, even
        when root names it: the directory is the user's to change under it."""
        scheme, _, rest = url.strip().partition("://")
        path = "/" + rest.lstrip("/")
        if scheme != SCHEME or path == "/":
            raise EndpointError(url)
        # /var/run is a symlink to /run, which a walk that follows none would refuse.
        inside = "/run/" + path.removeprefix("/var/run/") if path.startswith("/var/run/") else path
        uid, _, rel = inside.removeprefix(RUN_USER + "/").partition("/")
        if inside.startswith(RUN_USER + "/") and uid.isdigit() and len(uid) < 11 and rel:
            return cls(url, inside, int(uid))
        return cls(url, path)

    def __str__(self) -> str:
        return self.url

    @property
    def where(self) -> str:
        """Where the engine listens, as a person would name it (its socket's path)."""
        return self._path

    def connect(self, timeout: float | None) -> socket.socket:
        """A new connection to the engine, with `timeout` on each of its operations (None:
        none). Raises OSError when nothing listens there, NotOwned for a found engine's
        socket that is not plainly its user's."""
        if self.owner is None:
            return _connect(self._path, timeout)
        held = _open_owned(self._path, self.owner)
        try:
            # The checked inode itself, whatever its path names by now.
            return _connect(f"/proc/self/fd/{held}", timeout)
        finally:
            os.close(held)

    def identity(self) -> tuple[int, int]:
        """(device, inode) of the socket: two URLs of one engine (a symlink given by root,
        /var/run for /run) have one. Raises OSError."""
        st = os.stat(self._path) if self.owner is None else os.lstat(self._path)
        return st.st_dev, st.st_ino

    def stat(self) -> os.stat_result:
        """The engine's socket file: its owner, group and mode are who may speak to the
        engine (`exitwatch adopt` gives its own socket the same). Raises OSError."""
        return os.stat(self._path)


def _connect(path: str, timeout: float | None) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.settimeout(timeout)
        sock.connect(path)
    except OSError:
        sock.close()
        raise
    return sock


class NotOwned(PermissionError):
    """A found engine's socket that is not plainly its user's: not followed."""


def _open_owned(path: str, uid: int) -> int:
    """An O_PATH descriptor of the socket at `path`, checked: no component a symlink, every
    directory root's and not writable by others, or `uid`'s; the socket `uid`'s. Raises
    NotOwned, or OSError (ENOENT: not there now)."""
    parts = [p for p in path.split("/") if p]
    fd = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            flags = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC | (0 if last else os.O_DIRECTORY)
            try:
                nxt = os.open(part, flags, dir_fd=fd)
            except OSError as err:
                if err.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise NotOwned(
                        err.errno, f"{path}: a symlink or not a directory on the way, not followed"
                    ) from None
                raise
            os.close(fd)
            fd = nxt
            st = os.fstat(fd)
            if last:
                if stat.S_ISLNK(st.st_mode) or not stat.S_ISSOCK(st.st_mode):
                    raise NotOwned(errno.EPERM, f"{path} is not a socket, not followed")
                if st.st_uid != uid:
                    raise NotOwned(
                        errno.EPERM, f"{path} belongs to uid {st.st_uid}, not {uid}: not followed"
                    )
            elif st.st_uid not in (0, uid) or (st.st_uid == 0 and st.st_mode & 0o022):
                raise NotOwned(
                    errno.EPERM,
                    f"{path}: directory /{'/'.join(parts[: i + 1])} may be changed by others "
                    f"than root and uid {uid}: not followed",
                )
    except BaseException:
        os.close(fd)
        raise
    return fd


def valid(url: str) -> bool:
    """Whether `url` names an engine exitwatch speaks to (config checks)."""
    try:
        Endpoint.parse(url)
    except EndpointError:
        return False
    return True


def chosen(*settings: str | None, env: Mapping[str, str] = os.environ) -> Endpoint:
    """The engine meant: the first of `settings` given, else DOCKER_HOST, else the default.
    Raises EndpointError."""
    for url in settings:
        if url:
            return Endpoint.parse(url)
    url = env.get(ENV, "").strip() or DEFAULT_URL
    try:
        return Endpoint.parse(url)
    except EndpointError:
        raise EndpointError(url, FROM_ENV) from None


def podman(env: Mapping[str, str] = os.environ) -> Endpoint | None:
    """The podman service that CONTAINER_HOST names, None when it is unset or empty.
    podman's CLI reads unix:///PATH, unix://PATH and unix:/PATH alike (bindings/connection.go:
    the host joined to the path); ssh:// and tcp:// are another host's. Raises EndpointError."""
    given = env.get(PODMAN_ENV, "").strip()
    if not given:
        return None
    scheme, colon, rest = given.partition(":")
    url = given
    if scheme == SCHEME and colon and rest.startswith("/") and not rest.startswith("//"):
        url = f"{SCHEME}://{rest}"
    if "?" in url or "#" in url:
        raise EndpointError(given, FROM_PODMAN_ENV)
    try:
        return Endpoint.parse(url)
    except EndpointError:
        raise EndpointError(given, FROM_PODMAN_ENV) from None


def served(path: str) -> str:
    """The URL of a socket this process serves at `path` (the run's, for its command)."""
    return f"{SCHEME}://{path}"
