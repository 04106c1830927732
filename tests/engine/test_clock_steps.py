"""A wall clock stepped under `exitwatch reap` or a running agent, for that process alone
(support/clock.py), must never make an older unlabelled compose sibling look younger than
its dead owner. Real compose v1 and v2 (support/tools.py finds or installs each), the
private engine, real owners and SIGKILL.

The project: `prod-app` (running) and `prod-db` (created, never started) are brought up
unlabelled before the owner starts; then the owner's labelled `eval-app`, and an unlabelled
`helper` of the same working directory and files."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from support import tools
from support.agentproc import Agent, agent_argv, exists, quiet_config
from support.clock import Shift
from support.procs import kill, spawn_owner, wait_for

COMPOSE_YML = """\
version: "2.4"
services:
  prod-app:
    image: exitwatch-test/busybox:latest
    command: sleep infinity
  prod-db:
    image: exitwatch-test/busybox:latest
    command: sleep infinity
  eval-app:
    image: exitwatch-test/busybox:latest
    command: sleep infinity
    labels:
      exitwatch.owner: ${EXITWATCH_OWNER}
  helper:
    image: exitwatch-test/busybox:latest
    command: sleep infinity
"""
HOUR = 3600.0
# What the agent says when it will not compare creation times: a clock off the kernel's.
SHIFTED = "off the kernel's boot time, so creation times prove no order"


def _v1(engine, where: Path, *args: str, env: dict[str, str]) -> None:
    try:
        binary = tools.compose_v1()
    except tools.Unavailable as err:
        pytest.skip(str(err))
    argv = [binary, *args]
    subprocess.run(
        argv, cwd=where, env=engine.env(**env), check=True, capture_output=True, timeout=300
    )


def _v2(engine, where: Path, *args: str, env: dict[str, str]) -> None:
    try:
        config = tools.docker_config()
    except tools.Unavailable as err:
        pytest.skip(str(err))
    subprocess.run(
        ["docker", "compose", *args],
        cwd=where,
        env=engine.env(DOCKER_CONFIG=str(config), **env),
        check=True,
        capture_output=True,
        timeout=300,
    )


@pytest.fixture(params=["v1", "v2"])
def compose(request) -> Callable[..., None]:
    return {"v1": _v1, "v2": _v2}[request.param]


class Project:
    """The compose project of this module's docstring, in `where`."""

    def __init__(self, engine, compose, where: Path) -> None:
        self.engine, self.compose, self.where = engine, compose, where
        self.name = f"ew{uuid.uuid4().hex[:10]}"
        where.mkdir()
        (where / "docker-compose.yml").write_text(COMPOSE_YML)

    def up(self, *args: str, owner: str = "") -> None:
        env = {"EXITWATCH_OWNER": owner}
        self.compose(self.engine, self.where, "-p", self.name, "up", *args, env=env)

    def ids(self) -> dict[str, str]:
        """Service -> container id, of the project's containers now."""
        listed = self.engine.client.api.containers(
            all=True, filters={"label": f"com.docker.compose.project={self.name}"}
        )
        return {c["Labels"]["com.docker.compose.service"]: c["Id"] for c in listed}


def older_then_owner(engine, compose, where: Path):
    """The project with its older siblings up, then the owner and its containers."""
    project = Project(engine, compose, where)
    project.up("-d", "prod-app")
    project.up("--no-start", "prod-db")
    owner = spawn_owner()
    project.up("-d", "eval-app", "helper", owner=str(owner.owner))
    return owner, project.ids()


def refusals(log: str, ids: dict[str, str]) -> dict[str, str]:
    """Service -> the log line that refused its container, of those refused."""
    out = {}
    for line in log.splitlines():
        for service, cid in ids.items():
            if f"refused container {cid[:12]} " in line:
                out[service] = line
    return out


def judged(engine, ids: dict[str, str], log: str, shift: float) -> None:
    """What must stay, and why (from the log); the owner's own container is gone either way."""
    why = refusals(log, ids)
    assert not exists(engine, ids["eval-app"])
    # Running since before the owner: refused by the ticks since boot, whatever the clock.
    assert exists(engine, ids["prod-app"])
    assert "its main process started before its owner did" in why["prod-app"]
    assert exists(engine, ids["prod-db"])
    if shift == 0:
        assert "it was created before its owner started" in why["prod-db"]
        assert not exists(engine, ids["helper"])  # younger: it goes with the project
        return
    # The cost: with the clock shifted, no creation time is compared, so the younger
    # unlabelled sibling stays too, and says why.
    assert SHIFTED in why["prod-db"]
    assert exists(engine, ids["helper"])
    assert SHIFTED in why["helper"]


@pytest.mark.parametrize("shift", [-HOUR, 0.0, HOUR])
def test_reap_with_its_clock_stepped_removes_no_older_sibling(engine, compose, tmp_path, shift):
    owner, ids = older_then_owner(engine, compose, tmp_path / "app")
    kill(owner)
    clock = Shift(tmp_path)
    clock.set(shift)
    (tmp_path / "empty").mkdir()
    argv = [sys.executable, "-m", "exitwatch", "reap", "--config", quiet_config(tmp_path)]
    argv += ["--docker-host", engine.host]
    argv += ["--workdir-root", str(tmp_path / "empty")]
    argv += ["--hook-dir", str(tmp_path / "hooks"), "--audit-log", str(tmp_path / "audit.jsonl")]
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=120, env=os.environ | clock.env()
    )
    assert done.returncode == 0, done.stderr
    judged(engine, ids, done.stderr, shift)


@pytest.mark.parametrize("shift", [-HOUR, HOUR])
def test_an_agent_whose_clock_is_stepped_after_it_saw_the_owner_removes_no_older_sibling(
    engine, compose, workroot, tmp_path, shift
):
    clock = Shift(tmp_path)
    agent = Agent(agent_argv("netlink", engine.host, workroot), tmp_path / "agent.log", clock.env())
    try:
        agent.wait_log("ready:")
        owner, ids = older_then_owner(engine, compose, tmp_path / "app")
        agent.wait_holding(owner.pid, containers=1)
        clock.set(shift)
        kill(owner)
        wait_for(lambda: not exists(engine, ids["eval-app"]), what="the owner's container gone")
        wait_for(lambda: len(refusals(agent.text(), ids)) >= 3, what="the three refusals")
        judged(engine, ids, agent.text(), shift)
    finally:
        agent.stop()
