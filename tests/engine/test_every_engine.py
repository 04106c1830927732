"""Every engine on the host at once, as the engines issue's "done when" has it: root's Docker
and root's podman (given), and one user's rootless Docker and rootless podman (found at
/run/user/UID), each holding containers of owners that are then SIGKILLed together. One
agent removes everything of the dead owners from every engine, touches nothing of the
live ones, and leaves another machine's owners alone."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import docker.errors

from exitwatch.contract import LABEL_OWNER
from exitwatch.owner import current_machine_id

from support.agentproc import Agents, container
from support.procs import kill, spawn_owner, wait_for
from support.rootless import UserRunner

# From the SIGKILLs to every dead owner's container gone, on four engines at once; the
# figure is printed. Looser than the second promised for one engine: the suite runs beside
# another pass on 2 cores.
ALL_GONE_WITHIN = 3.0
OTHER_MACHINE = "2" * 32 if current_machine_id() == "1" * 32 else "1" * 32


def exists(where, cid: str) -> bool:
    """Whether the container is on the engine; podman 4.3 answers an inspect of one being
    removed with 500 "no such container" (docs/podman.md)."""
    try:
        where.client.api.inspect_container(cid)
    except docker.errors.APIError as err:
        if err.status_code == 404 or "no such container" in str(err.explanation):
            return False
        raise
    return True


def test_dead_owners_leave_nothing_on_any_engine_and_nothing_else_goes(
    engine, podman, rootless_docker, rootless_podman, workroot: Path, tmp_path: Path
) -> None:
    agents = Agents(None, workroot, tmp_path)
    agent = agents.start("--engine", engine.host, "--engine", podman.host, "--find-engines")
    dead, live = spawn_owner(), spawn_owner()
    users = [UserRunner(rootless_docker), UserRunner(rootless_podman)]
    alive = [UserRunner(rootless_docker), UserRunner(rootless_podman)]
    try:
        doomed = {container(engine, dead.pid): engine, container(podman, dead.pid): podman}
        kept = {container(engine, live.pid): engine, container(podman, live.pid): podman}
        # Another machine's owner, on a shared engine: never this agent's to judge.
        away = f"{OTHER_MACHINE}:{uuid.uuid4()}:4242:1"
        theirs = {
            container(engine, labels={LABEL_OWNER: away}): engine,
            container(podman, labels={LABEL_OWNER: away}): podman,
        }
        mine = [engine.host, podman.host, rootless_docker.host, rootless_podman.host]
        pids = {dead.pid, live.pid, *(r.pid for r in users + alive)}

        def holding() -> bool:
            doc = agent.status()
            engines = {e["endpoint"]: e for e in doc["docker"]["engines"]}
            connected = all(engines.get(h, {}).get("connected") for h in mine)
            return connected and {o["pid"] for o in doc["owners"]} >= pids

        wait_for(holding, timeout=60, what="the agent to follow all four engines' owners")

        kill(dead)
        killed = time.monotonic()
        for runner in users:
            runner.kill()
        wait_for(
            lambda: (
                not any(exists(where, cid) for cid, where in doomed.items())
                and all(not r.present() for r in users)
            ),
            timeout=30,
            what="every dead owner's things gone from every engine",
        )
        took = time.monotonic() - killed
        print(f"\nfour engines: SIGKILL to every dead owner's things gone: {took:.3f} s")
        assert took < ALL_GONE_WITHIN

        assert all(exists(where, cid) for cid, where in {**kept, **theirs}.items())
        assert all(r.present() == r.things() for r in alive)
        assert [e["machine"] for e in agent.status()["elsewhere"]] == [OTHER_MACHINE]
        assert agent.alive()
    finally:
        kill(live)
        for runner in users + alive:
            runner.close()
        agents.stop()
