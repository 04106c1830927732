"""Several engines at once, with real engines: the suite's private engine, and a second
real dockerd whose socket sits where a user's rootless Docker puts its own
(/run/user/UID/docker.sock, made the user's), so that an agent with `find_engines` finds it
as it appears, follows it, lets it go when it goes, and finds it again. A dead owner's
containers go from every engine; a user's symlink to another socket is not followed."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from support.agentproc import Agent, Agents, agent_argv, container, exists, quiet_config, wait_gone
from support.cli import EXITWATCH
from support.engine import ENGINE_SH, IMAGE, PrivateEngine
from support.locks import turn
from support.procs import kill, run, spawn_owner, wait_for

# From SIGKILL to gone on each engine: a second is the promise; the suite runs beside
# another pass on 2 cores, so the bound here is looser, and the figure is printed.
GONE_WITHIN = 5.0


class UsersEngine:
    """A real dockerd of root's, its socket at the user's rootless place and the user's."""

    def __init__(self, directory: Path, user: pwd.struct_passwd) -> None:
        self.dir, self.user = directory, user
        self.rundir = Path(f"/run/user/{user.pw_uid}")
        self.socket = self.rundir / "docker.sock"
        self.host = f"unix://{self.socket}"
        self.engine: PrivateEngine | None = None

    def start(self) -> PrivateEngine:
        self.rundir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chown(self.rundir, self.user.pw_uid, self.user.pw_gid)
        run([str(ENGINE_SH), "start", str(self.dir), str(self.socket)])
        os.chown(self.socket, self.user.pw_uid, self.user.pw_gid)
        self.engine = PrivateEngine(self.dir, self.host, IMAGE, docker.DockerClient(self.host))
        return self.engine

    def stop(self) -> None:
        if self.engine is not None:
            self.engine.client.close()
            self.engine = None
        run([str(ENGINE_SH), "stop", str(self.dir)])
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()  # dockerd leaves it; a user's engine takes it with it


@pytest.fixture(scope="module")
def users(engine: PrivateEngine, attacker: pwd.struct_passwd) -> Iterator[UsersEngine]:
    """The user's engine, started; one module at a time on the host holds the user's
    runtime directory (both passes run this file)."""
    with turn("run-user"):
        made = not Path(f"/run/user/{attacker.pw_uid}").exists()
        # Inside the session's engine directory: short, and purged with it if the session dies.
        second = UsersEngine(engine.dir / "e2", attacker)
        second.start()
        try:
            yield second
        finally:
            second.stop()
            run([str(ENGINE_SH), "purge", str(second.dir)])
            if made:
                shutil.rmtree(second.rundir, ignore_errors=True)


@pytest.fixture
def agents(engine: PrivateEngine, workroot: Path, tmp_path: Path) -> Iterator[Agents]:
    started = Agents(engine.host, workroot, tmp_path)
    yield started
    started.stop()


def engines_of(agent: Agent) -> dict[str, dict]:
    return {e["endpoint"]: e for e in agent.status()["docker"]["engines"]}


def gone_after_kill(cids: dict[str, PrivateEngine], owner) -> float:
    """SIGKILL `owner`, wait until each container is gone from its engine; the seconds."""
    kill(owner)
    killed = time.monotonic()
    for cid, where in cids.items():
        wait_gone(where, [cid])
    took = time.monotonic() - killed
    print(f"SIGKILL to gone on {len(cids)} containers of {len(cids)} engines: {took:.3f} s")
    return took


def test_given_engines_are_all_followed_and_a_dead_owner_leaves_none(
    engine: PrivateEngine, users: UsersEngine, agents: Agents, workroot: Path
) -> None:
    assert users.engine is not None
    argv = agent_argv("netlink", engine.host, workroot)
    at = argv.index("--docker-host")
    argv[at : at + 2] = ["--engine", engine.host, "--engine", users.host]
    agent = agents.start(argv=argv)
    owner = spawn_owner()
    mine = {container(engine, owner.pid): engine, container(users.engine, owner.pid): users.engine}
    live = spawn_owner()
    kept = container(users.engine, live.pid)
    wait_for(
        lambda: [e.get("resources") for e in engines_of(agent).values()] == [1, 2],
        what="the agent to hold both engines' containers",
    )
    assert {e["how"] for e in engines_of(agent).values()} == {"configured"}
    assert gone_after_kill(mine, owner) < GONE_WITHIN
    assert users.engine.client.api.inspect_container(kept)["State"]["Running"]
    kill(live)


def test_an_engine_found_is_followed_from_when_it_appears_until_it_goes(
    engine: PrivateEngine, users: UsersEngine, agents: Agents
) -> None:
    users.stop()
    agent = agents.start("--find-engines")
    # Other users' engines on this host (other tests') may be found too: only these two
    # are this test's.
    assert users.host not in engines_of(agent)
    uid = users.user.pw_uid
    second = users.start()
    agent.wait_log(f"engine found: {users.host} (rootless Docker of uid {uid})")
    wait_for(lambda: engines_of(agent)[users.host]["connected"], what="the found one followed")

    owner = spawn_owner()
    mine = {container(engine, owner.pid): engine, container(second, owner.pid): second}
    away = spawn_owner()
    left = container(second, away.pid)
    wait_for(
        lambda: engines_of(agent)[users.host].get("resources") == 2,
        what="the agent to hold the found engine's containers",
    )
    assert gone_after_kill(mine, owner) < GONE_WITHIN

    # It goes: the agent lets it go. Its owner dies meanwhile; when the engine is back, the
    # agent finds it again, and its listing shows the dead owner's container, which goes.
    users.stop()
    agent.wait_log(f"engine gone: {users.host}")
    assert users.host not in engines_of(agent)
    kill(away)
    second = users.start()
    agent.wait_log(f"engine found: {users.host}", count=2)
    wait_gone(second, [left])


def test_a_users_symlink_to_another_engines_socket_is_not_followed(
    engine: PrivateEngine, users: UsersEngine, agents: Agents
) -> None:
    users.stop()
    users.rundir.mkdir(mode=0o700, exist_ok=True)
    os.chown(users.rundir, users.user.pw_uid, users.user.pw_gid)
    # The user's docker.sock names root's engine; the user's podman.sock is a socket of the
    # user's own (nothing answers it), found at the same look.
    users.socket.symlink_to(engine.socket)
    podman = users.rundir / "podman" / "podman.sock"
    podman.parent.mkdir(exist_ok=True)
    os.chown(podman.parent, users.user.pw_uid, users.user.pw_gid)
    listening = socket.socket(socket.AF_UNIX)
    listening.bind(str(podman))
    os.chown(podman, users.user.pw_uid, users.user.pw_gid)
    try:
        agent = agents.start("--find-engines")
        agent.wait_log(f"engine found: unix://{podman}")
        followed = engines_of(agent)
        assert f"unix://{podman}" in followed and users.host not in followed
    finally:
        listening.close()
        podman.unlink()
        users.socket.unlink()
    users.start()


def test_exitwatch_reap_reaps_on_every_engine_it_finds(
    engine: PrivateEngine, users: UsersEngine, workroot: Path, tmp_path: Path
) -> None:
    assert users.engine is not None
    owner = spawn_owner()
    mine = container(engine, owner.pid)
    found = container(users.engine, owner.pid)
    live = spawn_owner()
    kept = container(users.engine, live.pid)
    kill(owner)
    argv = [*EXITWATCH, "reap", "--config", quiet_config(tmp_path), "--find-engines"]
    argv += ["--docker-host", engine.host, "--workdir-root", str(workroot), "--audit-log", ""]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert not exists(engine, mine) and not exists(users.engine, found)
    assert exists(users.engine, kept)
    kill(live)
