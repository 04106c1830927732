"""A real unprivileged user's rootless engines (support/rootless.sh): its rootless dockerd and
rootless podman service, at /run/user/UID as on a bench host, and how a test drives them as
that user. The `rootless_user`, `rootless_docker`, `rootless_podman` and `rootless_engine`
fixtures (tests/conftest.py) are built on these.

Each test session (each xdist worker is one) gets a user of its own, made here and deleted at
its end: a user has one /run/user/UID/docker.sock, so two sessions sharing one would start,
stop and empty each other's engines. Its directory (root's: the engines' logs and pid files,
and the user's home, which holds their data) is named after the session's process, as the
`engine` fixture's is, so that the user and engines of a session that died are found and
purged by the next one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import docker
import docker.errors

from exitwatch.owner import Owner

from support.engine import (
    BUILTIN_NETWORKS,
    IMAGE,
    dead_sessions,
    empty,
    session_dir,
)
from support.procs import run
from support.users import SYSTEM_PYTHON, setpriv_argv, users_database

ROOTLESS_SH = Path(__file__).with_name("rootless.sh")
REPO = Path(__file__).resolve().parents[2]
# Short and fixed: a later session finds a dead one's directory here.
BASE = Path("/tmp/exitwatch-rootless")
PREFIX = "exitwatch-rl"
ENGINES = ("docker", "podman")
PATH = "/usr/sbin:/usr/bin:/sbin:/bin"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RootlessUser:
    """The user, and what it runs with: a login's environment, without a login."""

    pw: pwd.struct_passwd
    dir: Path  # root's, for rootless.sh; the user's home is below it

    @property
    def name(self) -> str:
        return self.pw.pw_name

    @property
    def uid(self) -> int:
        return self.pw.pw_uid

    @property
    def home(self) -> Path:
        return Path(self.pw.pw_dir)

    @property
    def runtime_dir(self) -> Path:
        return Path(f"/run/user/{self.uid}")

    def env(self, **extra: str) -> dict[str, str]:
        """The whole environment of the user's processes: its home and runtime directory, and
        this checkout on PYTHONPATH, so that `/usr/bin/python3 -m exitwatch` runs as the user."""
        base = {
            "HOME": str(self.home),
            "XDG_RUNTIME_DIR": str(self.runtime_dir),
            "PATH": PATH,
            "PYTHONPATH": str(REPO),
        }
        return base | extra

    def argv(self, *argv: str, **env: str) -> list[str]:
        """`argv` as the user (its real ids, no groups), in env(**env) and nothing else."""
        words = [f"{k}={v}" for k, v in self.env(**env).items()]
        return setpriv_argv(self.pw, "env", "-i", *words, *argv)

    def run(self, *argv: str, check: bool = True, **env: str) -> subprocess.CompletedProcess[str]:
        """Run `argv` as the user, from /, and wait for it."""
        return run(self.argv(*argv, **env), cwd=Path("/"), check=check)

    def popen(self, *argv: str, env: dict[str, str] | None = None, **popen) -> subprocess.Popen:
        """Start `argv` as the user, from /; `popen` goes to Popen (its pipes)."""
        return subprocess.Popen(self.argv(*argv, **(env or {})), cwd="/", **popen)


@dataclass
class RootlessEngine:
    """One of the user's engines: `kind` is "docker" or "podman", `host` its unix:// URL at
    the standard path. `client` is root's docker-py client on that socket: root connects as
    the agent does, though the socket is the user's. What the user does goes through docker()
    (the docker CLI as the user) or the user's own processes (env())."""

    kind: str
    user: RootlessUser
    host: str
    image: str = IMAGE
    client: docker.DockerClient = field(init=False)

    def __post_init__(self) -> None:
        # The API version from /_ping, as the docker CLI and the agent take it: docker-py's
        # "auto" asks GET /version, which panics in Debian 13's rootless dockerd 26 under
        # rootlesskit --net=host (rootless.sh) and takes podman 0.4 to 1.2 s.
        version = _ping_api_version(self.socket)
        self.client = docker.DockerClient(base_url=self.host, version=version, timeout=60)

    @property
    def socket(self) -> Path:
        return Path(self.host.removeprefix("unix://"))

    def env(self, **extra: str) -> dict[str, str]:
        """The user's environment, pointed at this engine (DOCKER_HOST)."""
        return self.user.env(DOCKER_HOST=self.host, **extra)

    def docker(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """The docker CLI as the user, against this engine (podman's Docker API too)."""
        return self.user.run("docker", *args, check=check, DOCKER_HOST=self.host)

    def start(self) -> None:
        """Start it (again): it answers, with the test image, when this returns."""
        run([str(ROOTLESS_SH), "start", self.kind, self.user.name, str(self.user.dir)])

    def stop(self) -> None:
        run([str(ROOTLESS_SH), "stop", self.kind, self.user.name, str(self.user.dir)])

    def exists(self, kind: str, key: str) -> bool:
        """Whether the container, network or volume `key` is on the engine."""
        get = {
            "container": self.client.api.inspect_container,
            "network": self.client.api.inspect_network,
            "volume": self.client.api.inspect_volume,
        }[kind]
        try:
            get(key)
        except docker.errors.NotFound:
            return False
        except docker.errors.APIError as err:
            # podman, while it removes one: 500 "... does not exist in database" (4.3), or
            # "no container with ID ... found in database: no such container" (5.4).
            if any(w in str(err.explanation) for w in ("does not exist", "no such container")):
                return False
            raise
        return True

    def clean(self) -> None:
        """Remove every container, network and volume, so that tests stay independent."""
        empty(self.client, self.start, BUILTIN_NETWORKS | {"podman"})  # podman's own network


def _ping_api_version(path: Path) -> str:
    """The Api-Version header of the engine's answer to /_ping at socket `path`."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(str(path))
        sock.sendall(b"GET /_ping HTTP/1.0\r\nHost: localhost\r\n\r\n")
        head = b""
        while b"\r\n\r\n" not in head and (chunk := sock.recv(4096)):
            head += chunk
    for line in head.decode("latin-1").split("\r\n")[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "api-version":
            return value.strip()
    raise AssertionError(f"no Api-Version in the answer to /_ping at {path}: {head!r}")


class Removals:
    """When each container was removed, by the engine's own clock: the time of its event
    (dockerd's "destroy", podman's "remove"), so that a test neither polls an engine while it
    removes (a podman inspect takes the container's lock, and slowed the removal it timed)
    nor counts the stream's delay. The engine is local: its clock is time.time()'s."""

    GONE = ("destroy", "remove")

    def __init__(self, engine: RootlessEngine) -> None:
        self.engine = engine
        self.seen: dict[str, float] = {}
        self._cond = threading.Condition()
        self._stream = engine.client.api.events(decode=True, filters={"type": "container"})
        self._thread = threading.Thread(target=self._follow, daemon=True)
        self._thread.start()
        # The engine answers an events request before it subscribes: a container removed
        # now and seen proves the stream is live.
        probe = engine.client.api.create_container(engine.image)["Id"]
        engine.client.api.remove_container(probe, force=True)
        if self.when(probe, 30) is None:
            raise AssertionError(f"{engine.kind}'s events stream did not report a removal in 30 s")

    def _follow(self) -> None:
        with contextlib.suppress(Exception):  # the stream ends with an error when closed
            for event in self._stream:
                if event.get("Action") in self.GONE and "timeNano" in event:
                    with self._cond:
                        self.seen[event["Actor"]["ID"]] = event["timeNano"] / 1e9
                        self._cond.notify_all()

    def when(self, cid: str, timeout: float) -> float | None:
        """The time (time.time()'s clock) container `cid` was removed; None if no event says
        so within `timeout` seconds from now."""
        with self._cond:
            self._cond.wait_for(lambda: cid in self.seen, timeout)
            return self.seen.get(cid)

    def close(self) -> None:
        self._stream.close()


def _purge(d: Path) -> None:
    """Stop the engines of the user whose directory is `d`, end its processes, delete it and
    remove `d` (rootless.sh purge)."""
    name = (d / "user").read_text().strip() if (d / "user").is_file() else None
    with contextlib.suppress(KeyError):
        if name is not None:
            pwd.getpwnam(name)
            run([str(ROOTLESS_SH), "purge", name, str(d)])
            with users_database():
                # --force: no session of the user's (a login) should be left, but a process
                # in its last instant must not keep the user alive.
                run(["userdel", "--force", name], check=False)
    if d.exists():
        run(["rm", "-rf", "--one-file-system", str(d)])


def purge_dead_sessions() -> None:
    """Purge the users and engines of sessions that died without purging theirs."""
    for d in dead_sessions(BASE):
        try:
            _purge(d)
        except AssertionError as err:
            log.warning("could not purge the stale rootless engines in %s: %s", d, err)


@contextlib.contextmanager
def session_user(session: Owner) -> Iterator[RootlessUser]:
    """This session's user: no login shell, a home below its directory, subordinate ids
    (useradd gives a user that is not a system one a range of its own: rootlesskit and podman
    map its containers' users there); purged and deleted afterwards."""
    purge_dead_sessions()
    BASE.mkdir(mode=0o755, exist_ok=True)
    d = session_dir(BASE, session)
    d.mkdir(mode=0o755)
    name = f"{PREFIX}{session.pid}"
    (d / "user").write_text(f"{name}\n")
    argv = ["useradd", "--home-dir", str(d / "home"), "--no-create-home"]
    argv += ["--shell", "/usr/sbin/nologin", "--user-group", name]
    with users_database():
        for ids in ("/etc/subuid", "/etc/subgid"):  # useradd gives ranges only where they exist
            Path(ids).touch(mode=0o644, exist_ok=True)
        run(argv)
    try:
        pw = pwd.getpwnam(name)
        os.mkdir(pw.pw_dir, 0o700)
        os.chown(pw.pw_dir, pw.pw_uid, pw.pw_gid)
        yield RootlessUser(pw, d)
    finally:
        _purge(d)


@contextlib.contextmanager
def started(user: RootlessUser, kind: str) -> Iterator[RootlessEngine]:
    """The user's `kind` engine, started (as the user) with the test image; stopped after.
    The user's purge removes the rest."""
    out = run([str(ROOTLESS_SH), "start", kind, user.name, str(user.dir)]).stdout
    engine = RootlessEngine(kind, user, out.strip())
    try:
        yield engine
    finally:
        engine.client.close()
        engine.stop()


# A runner of the user's, in the shell: it names itself the owner (`exitwatch labels --pid
# $$`), makes on the engine at DOCKER_HOST a running container (unless $2 is "no"), a network
# and a volume labelled with it, prints their ids one a line ("-" for no container), and
# stays (exec keeps its pid and start time, so the owner stays alive) until it is killed.
# `--network none`: a rootless podman cannot give a container its default network here
# (rootless.sh says why).
RUNNER = f"""set -e
labels=$({SYSTEM_PYTHON} -m exitwatch labels --pid $$ --format docker-args)
if [ "$2" = no ]; then echo -; else docker run -d --network none $labels "$1"; fi
docker network create $labels "exitwatch-rl-net-$$"
docker volume create $labels
exec sleep 1000000
"""


class UserRunner:
    """The user's runner process (RUNNER) on `engine`: `container` (None with
    `container=False`), `network` and `volume` are what it made; kill() is its SIGKILL."""

    def __init__(self, engine: RootlessEngine, container: bool = True) -> None:
        self.engine = engine
        pipes = {"stdin": subprocess.DEVNULL, "stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
        argv = ("/bin/sh", "-c", RUNNER, "runner", engine.image, "yes" if container else "no")
        self.proc = engine.user.popen(*argv, env={"DOCKER_HOST": engine.host}, **pipes)
        assert self.proc.stdout is not None
        made = [self.proc.stdout.readline().decode().strip() for _ in range(3)]
        if not all(made):
            self.proc.kill()
            _, err = self.proc.communicate(timeout=30)
            raise AssertionError(f"the user's runner failed on {engine.kind}: {err.decode()}")
        self.container = made[0] if container else None
        self.network, self.volume = made[1:]

    @property
    def pid(self) -> int:
        return self.proc.pid

    def things(self) -> list[tuple[str, str]]:
        """What it made, as (kind, id) pairs."""
        made = [("network", self.network), ("volume", self.volume)]
        return made if self.container is None else [("container", self.container), *made]

    def present(self) -> list[tuple[str, str]]:
        """What it made that is still on the engine."""
        return [(k, key) for k, key in self.things() if self.engine.exists(k, key)]

    def kill(self) -> float:
        """SIGKILL; the time it was sent (time.time()'s clock, as Removals')."""
        at = time.time()
        self.proc.kill()
        self.proc.wait()
        return at

    def close(self) -> None:
        if self.proc.poll() is None:
            self.kill()
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()
