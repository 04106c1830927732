"""The suite's private Docker engine as the tests drive it: its script (engine.sh), its
test image, and the client, CLI and compose calls pointed at it. The `engine` fixture
(tests/conftest.py) starts one per session; the `podman` fixture a private rootful podman
(podman.sh), driven the same way through its Docker API."""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
import docker.errors
import docker.utils

from exitwatch.owner import Owner, current_boot_id, death

from support.procs import run

ENGINE_SH = Path(__file__).with_name("engine.sh")
PODMAN_SH = Path(__file__).with_name("podman.sh")
IMAGE = "exitwatch-test/busybox:latest"
BUILTIN_NETWORKS = {"bridge", "host", "none"}


def session_dir(base: Path, owner: Owner) -> Path:
    """The directory below `base` of the test session whose process is `owner`: named after
    it, so that a later session can tell that it died (dead_sessions)."""
    # Part of the boot id tells this boot's sessions from a previous boot's, in little room.
    return base / f"{owner.boot_id[:8]}-{owner.pid}-{owner.starttime}"


def dead_sessions(base: Path) -> Iterator[Path]:
    """The session directories below `base` whose sessions died without removing them."""
    if not base.is_dir():
        return
    boot = current_boot_id()
    for d in base.iterdir():
        try:
            prefix, pid, start = d.name.split("-")
            alive = prefix == boot[:8] and death(Owner(boot, int(pid), int(start))) is None
        except ValueError:
            alive = False
        if not alive:
            yield d


def empty(
    client: docker.DockerClient, start: Callable[[], None], keep: set[str] = BUILTIN_NETWORKS
) -> None:
    """Remove every container, network (but those named in `keep`: the engine's own) and
    volume, so that tests stay independent; `start` the engine first if it does not answer
    (a test stopped it and failed before it could start it again)."""
    try:
        client.ping()
    except docker.errors.DockerException:
        start()
    api = client.api
    for c in api.containers(all=True):
        with contextlib.suppress(docker.errors.NotFound):
            api.remove_container(c["Id"], force=True, v=True)
    for n in api.networks():
        if n["Name"] not in keep:
            with contextlib.suppress(docker.errors.NotFound):
                api.remove_network(n["Id"])
    # From API 1.42 (Docker 23) a prune takes only anonymous volumes unless told "all";
    # older engines (podman 4.3 answers 1.41) refuse that filter, and prune named ones too
    # without it.
    everything = {"all": "true"} if docker.utils.version_gte(api.api_version, "1.42") else None
    api.prune_volumes(filters=everything)


@functools.cache
def _plain_distutils() -> dict[str, str]:
    """SETUPTOOLS_USE_DISTUTILS=stdlib where /usr/bin/python3, which runs every compose v1
    of the suite (support/tools.compose_v1), has the standard library's distutils (before
    Python 3.12). compose v1 imports distutils, and bookworm's docker-py 5 under it; where
    setuptools is installed, its shim answers that import with all of setuptools and
    pkg_resources: 0.80 s of CPU for a `docker-compose version`, 0.37 s with the variable,
    which turns the shim off. The same distutils, bar the time. Every process env() is given
    to has it; none but compose imports distutils (the product imports no SDK)."""
    plain = subprocess.run(
        ["/usr/bin/python3", "-S", "-c", "import distutils.version, distutils.spawn"],
        capture_output=True,
        timeout=60,
    )
    return {"SETUPTOOLS_USE_DISTUTILS": "stdlib"} if plain.returncode == 0 else {}


@dataclass
class PrivateEngine:
    dir: Path
    host: str
    image: str
    client: docker.DockerClient

    SCRIPT = ENGINE_SH  # what starts, stops and purges it
    SOCKET = "docker.sock"  # its socket, in dir

    @property
    def socket(self) -> Path:
        return self.dir / self.SOCKET

    def env(self, **extra: str) -> dict[str, str]:
        """The environment for the docker CLI and docker-compose, pointed at this engine."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DOCKER_", "COMPOSE_"))}
        return env | _plain_distutils() | {"DOCKER_HOST": self.host} | extra

    def docker(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return run(["docker", *args], env=self.env(), check=check)

    def compose(
        self, *args: str, cwd: Path, env: dict[str, str] | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return run(["docker-compose", *args], env=self.env(**(env or {})), cwd=cwd, check=check)

    def start(self) -> None:
        """Start it (again); it answers when this returns."""
        run([str(self.SCRIPT), "start", str(self.dir), str(self.socket)])

    def stop(self) -> None:
        run([str(self.SCRIPT), "stop", str(self.dir)])

    def clean(self) -> None:
        """Remove every container, network and volume, so that tests stay independent."""
        empty(self.client, self.start)


class PrivatePodman(PrivateEngine):
    """A private rootful podman (podman.sh) driven through its Docker API, as PrivateEngine
    drives dockerd; its service stops without its containers, which a start finds again."""

    SCRIPT = PODMAN_SH
    SOCKET = "podman.sock"

    def podman(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """The podman CLI as a client of this service (podman --remote)."""
        return run(["podman", "--url", self.host, *args], env=self.env(), check=check)

    def local(self, *args: str) -> subprocess.CompletedProcess[str]:
        """podman itself on this engine's storage, its service running or not (podman.sh)."""
        return run([str(self.SCRIPT), "podman", str(self.dir), *args])

    def podman_compose(
        self, *args: str, cwd: Path, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """podman-compose, whose podman calls go to this service: CONTAINER_HOST makes
        podman a remote client (podman-compose's --podman-args go after the subcommand,
        where podman takes no global option)."""
        env = self.env(CONTAINER_HOST=self.host)
        return run(["podman-compose", *args], env=env, cwd=cwd, check=check)

    def clean(self) -> None:
        """What PrivateEngine.clean removes, and every pod first (podman-compose's): a pod's
        infra container goes only with its pod."""
        try:
            self.client.ping()
        except docker.errors.DockerException:
            self.start()
        self.podman("pod", "rm", "--all", "--force")
        super().clean()
