"""`exitwatch adopt` as the tests run it: the real command, its socket bound by hand in a
fresh directory or held as systemd holds it (socket activation), and runner containers that
mount that socket in place of /var/run/docker.sock, with a docker CLI of the host's (and
compose v2) mounted in."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import docker

from exitwatch.contract import ADOPT_OWNER, LABEL_ADOPT, LABEL_OWNER
from exitwatch.owner import Owner, current_boot_id, current_machine_id
from exitwatch.procfs import read_stat

from support.procs import wait_for

STATIC_CLI = "/usr/local/bin/docker"  # statically linked: runs in a busybox container as it is
DEBIAN_CLI = "/usr/bin/docker"  # Debian's, linked against libc
PLUGINS = "/usr/libexec/docker/cli-plugins"  # where the CLI looks, in a container


# What systemd does for a socket unit's service: the socket as fd 3, LISTEN_FDS=1, and
# LISTEN_PID the service's own pid, which is known once forked: set just before the exec.
_ACTIVATE = """
import os, sys
fd = int(sys.argv[1])
os.dup2(fd, 3)
os.close(fd)
os.environ.update(LISTEN_PID=str(os.getpid()), LISTEN_FDS="1")
os.execv(sys.argv[2], sys.argv[2:])
"""


class Adopt:
    """An `exitwatch adopt` process for the engine socket `engine`, logging to `log`: it
    binds `listen` itself, or, with `held`, serves the socket held there (as systemd
    passes it, with LISTEN_FDS and LISTEN_PID)."""

    def __init__(
        self,
        engine: Path,
        listen: Path,
        log: Path,
        rules: tuple[str, ...] = (),
        held: socket.socket | None = None,
        preexec: Callable[[], None] | None = None,
        containers: tuple[str, ...] = (),
    ) -> None:
        self.listen, self.log = listen, log
        argv = [sys.executable, "-m", "exitwatch", "adopt", "--docker-host", f"unix://{engine}"]
        argv += ["--listen", str(listen)]
        for rule in rules:
            argv += ["--rule", rule]
        for pattern in containers:
            argv += ["--container", pattern]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DOCKER_", "LISTEN_"))}
        fds: tuple[int, ...] = ()
        if held is not None:
            fds = (held.fileno(),)
            argv = [sys.executable, "-c", _ACTIVATE, str(held.fileno()), *argv]
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log.open("ab"),
            env=env,
            cwd="/",
            pass_fds=fds,
            preexec_fn=preexec,  # a cgroup or a resource limit of its own, before the exec
        )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_ready(self, count: int = 1) -> None:
        def ready() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"adopt exited {self.proc.returncode}:\n{self.text()}")
            return self.text().count("ready: serving") >= count

        wait_for(ready, timeout=30, what="exitwatch adopt to be ready")

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def short_dir(prefix: str = "exitwatch-adopt-") -> Path:
    """A fresh root-owned directory in the scratch directory, short enough for socket paths."""
    return Path(tempfile.mkdtemp(prefix=prefix))


@contextlib.contextmanager
def adopting(
    engine,
    rules: tuple[str, ...] = (),
    logs: Path | None = None,
    preexec: Callable[[], None] | None = None,
    containers: tuple[str, ...] = (),
) -> Iterator[Adopt]:
    """`exitwatch adopt` in front of the private engine, bound by hand in a fresh directory;
    stopped afterwards. `preexec` runs in its process before the exec."""
    where = short_dir()
    log = (logs or where) / "adopt.log"
    adopt = Adopt(
        engine.socket, where / "docker.sock", log, rules, preexec=preexec, containers=containers
    )
    try:
        adopt.wait_ready()
        yield adopt
    finally:
        adopt.stop()
        shutil.rmtree(where, ignore_errors=True)


def holding(path: Path) -> socket.socket:
    """A listening socket bound at `path`, as a systemd .socket unit holds one."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    sock.bind(str(path))
    sock.listen(4096)
    return sock


def cli_mounts() -> list[str]:
    """`docker run` arguments that put a docker CLI at /bin/docker in a busybox container:
    the static one where the host has it, else Debian's (Debian 13 has no other), with the
    libraries it links mounted at their own paths."""
    # A file, not the directory a `-v` of a missing one left.
    if os.path.isfile(STATIC_CLI) and os.access(STATIC_CLI, os.X_OK):
        return ["-v", f"{STATIC_CLI}:/bin/docker:ro"]
    linked = subprocess.run(["ldd", DEBIAN_CLI], capture_output=True, text=True, check=True)
    libraries = re.findall(r"(/\S+) \(0x", linked.stdout)
    return ["-v", f"{DEBIAN_CLI}:/bin/docker:ro", *(f"-v{lib}:{lib}:ro" for lib in libraries)]


def runner_argv(
    adopt: Adopt, name: str, *extra: str, compose: Path | None = None, owner: bool = True
) -> list[str]:
    """`docker run -d` arguments of a runner container `name` with the adopt socket mounted
    where its clients look for the engine, and the static CLI (and compose v2's plugin,
    from the DOCKER_CONFIG `compose`) mounted in; labelled an owner (exitwatch.adopt=owner,
    Recipe 1's opt-in) unless `owner` is false."""
    argv = ["run", "-d", "--name", name, "-v", f"{adopt.listen}:/var/run/docker.sock"]
    if owner:
        argv += ["--label", f"{LABEL_ADOPT}={ADOPT_OWNER}"]
    argv += cli_mounts()
    if compose is not None:
        plugin = compose / "cli-plugins" / "docker-compose"
        argv += ["-v", f"{plugin}:{PLUGINS}/docker-compose:ro"]
    return [*argv, *extra]


def init_owner(engine, container: str) -> str:
    """The owner string of a running container's init, as the host names it."""
    return init_owner_of(engine.client.api, container)


def init_owner_of(api: docker.APIClient, container: str) -> str:
    """init_owner, through the client `api` (the soak's engine is no fixture's)."""
    pid = api.inspect_container(container)["State"]["Pid"]
    return str(Owner(current_boot_id(), pid, read_stat(pid).starttime, current_machine_id()))


def owned(engine, owner: str) -> dict[str, list[str]]:
    """The names of the containers, networks and volumes labelled with `owner`."""
    return owned_by(engine.client.api, owner)


def owned_by(api: docker.APIClient, owner: str) -> dict[str, list[str]]:
    """owned, through the client `api`."""
    label = {"label": f"{LABEL_OWNER}={owner}"}
    return {
        "containers": sorted(
            c["Names"][0].lstrip("/") for c in api.containers(all=True, filters=label)
        ),
        "networks": sorted(n["Name"] for n in api.networks(filters=label)),
        "volumes": sorted(v["Name"] for v in api.volumes(filters=label).get("Volumes") or []),
    }
