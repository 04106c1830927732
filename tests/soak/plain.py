"""Plain labelled owners: a process (root's) that holds a running container it labelled, a
compose project (a labelled service and an unlabelled one, and the project's network),
brought up by docker-compose v1 and by compose v2 in turn, and a marked workdir with
content; SIGKILLed. Every BARE_EVERY-th owner, the engine's own removal of a running
container of nobody's (`DELETE ?force=1`) is timed beside it, so that the agent's removal
latencies read against what the engine takes on this loaded machine at the same time."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from exitwatch.contract import ENV_OWNER, LABEL_COMPOSE_PROJECT, mark_workdir, owner_labels

from .actor import Actor, Ground, Owned, View
from .report import spread
from support import tools
from support.engine import IMAGE
from support.procs import Child, kill, spawn_owner

COMPOSE_YML = f"""\
services:
  main:
    image: {IMAGE}
    labels:
      exitwatch.owner: "${{{ENV_OWNER}}}"
  helper:
    image: {IMAGE}
"""
V1, V2 = "plain, compose v1", "plain, compose v2"
BARE_EVERY = 3


@dataclass
class Plain(Owned):
    child: Child | None = None
    containers: tuple[str, ...] = ()
    network: str = ""
    path: Path | None = None


class PlainOwners(Actor):
    name = "plain"
    live_target = 4
    steady_count = 2

    def __init__(self, ground: Ground) -> None:
        super().__init__(ground)
        self.root = ground.root
        self.n = 0
        self.docker_config = str(tools.docker_config())  # compose v2, as a CLI plugin
        self.bare: list[float] = []  # seconds each bare DELETE ?force=1 took

    def make(self, steady: bool) -> Plain:
        self.n += 1
        if self.n % BARE_EVERY == 0:
            self._time_bare_removal()
        row = V1 if self.n % 2 else V2
        child = spawn_owner()
        labels = owner_labels(child.pid)
        cid = self.api.create_container(IMAGE, "sleep infinity", labels=labels)["Id"]
        self.api.start(cid)
        path = self.root / f"p{self.n}"
        (path / "sub").mkdir(parents=True)
        (path / "sub" / "data").write_bytes(os.urandom(4096))
        (path / "compose").mkdir()
        (path / "compose" / "docker-compose.yml").write_text(COMPOSE_YML)
        mark_workdir(path, child.pid)
        project = f"soakp{self.n}"
        env = self.ground.env(**{ENV_OWNER: str(child.owner)})
        if row == V1:
            argv = ["docker-compose", "-p", project, "up", "-d"]
        else:
            argv = ["docker", "compose", "-p", project, "up", "-d"]
            env["DOCKER_CONFIG"] = self.docker_config
        done = subprocess.run(
            argv, cwd=path / "compose", env=env, capture_output=True, text=True, timeout=300
        )
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")
        of_project = {"label": f"{LABEL_COMPOSE_PROJECT}={project}"}
        listed = self.api.containers(all=True, filters=of_project)
        return Plain(
            name=f"plain owner {child.owner} ({project})",
            row=row,
            owner=str(child.owner),
            steady=steady,
            child=child,
            containers=(cid, *(c["Id"] for c in listed)),
            network=f"{project}_default",
            path=path,
        )

    def _time_bare_removal(self) -> None:
        cid = self.api.create_container(IMAGE, "sleep infinity")["Id"]
        self.api.start(cid)
        began = time.monotonic()
        self.api.remove_container(cid, force=True)
        self.bare.append(time.monotonic() - began)

    def figures(self) -> dict:
        return {"engine_bare_force_delete": spread(self.bare)}

    def end(self, owned: Owned) -> None:
        assert isinstance(owned, Plain) and owned.child is not None
        owned.died, owned.ended_by = time.time(), "SIGKILL"
        kill(owned.child, signal.SIGKILL)

    def _held(self, owned: Owned, view: View) -> tuple[list[str], list[str]]:
        """(what it holds, what it does not), one phrase each."""
        assert isinstance(owned, Plain) and owned.path is not None
        things = [(f"container {c[:12]}", c in view.containers) for c in owned.containers]
        things.append((f"network {owned.network}", owned.network in view.networks))
        things.append((f"workdir {owned.path}", (owned.path / "sub" / "data").exists()))
        return [w for w, there in things if there], [w for w, there in things if not there]

    def missing(self, owned: Owned, view: View) -> list[str]:
        return [f"{what} is gone" for what in self._held(owned, view)[1]]

    def remains(self, owned: Owned, view: View) -> list[str]:
        held = self._held(owned, view)[0]
        assert isinstance(owned, Plain) and owned.path is not None
        if owned.path.exists() and f"workdir {owned.path}" not in held:
            held.append(f"workdir {owned.path} (its content gone, the directory left)")
        return held


def actors(ground: Ground) -> list[Actor]:
    return [PlainOwners(ground)]
