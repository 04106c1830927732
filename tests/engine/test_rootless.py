"""The agent against a real user's rootless engines (support/rootless.py): the user's rootless
dockerd and rootless podman, each at its standard path under /run/user/UID, followed as
today's agent follows one engine (`[containers] docker_host`, here --docker-host), with the
user's own runner making what it owns; and what a root agent must not do with a path that a
user controls."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bench import stats
from exitwatch.service.status.server import query

from support.agentproc import Agent, Agents, container, exists
from support.procs import killed_owner, run, wait_for
from support.rootless import Removals, RootlessEngine, UserRunner
from support.users import as_user, temporary_user

# What the brief of these engines asks: a dead runner's things gone within a second.
REAP_DEADLINE = 1.0
# Trials of the latency measurement; more by hand: EXITWATCH_ROOTLESS_TRIALS=30.
TRIALS = int(os.environ.get("EXITWATCH_ROOTLESS_TRIALS", "5"))


@pytest.fixture
def rootless_agent(rootless_engine: RootlessEngine, tmp_path: Path) -> Iterator[Agent]:
    """A real agent as root, ready, following the user's engine by its socket."""
    root = tmp_path / "root"
    root.mkdir()
    agents = Agents(rootless_engine.host, root, tmp_path)
    try:
        yield agents.start("--no-find-engines")
    finally:
        agents.stop()


@pytest.fixture
def removals(rootless_engine: RootlessEngine) -> Iterator[Removals]:
    """The user's engine's removals, by its events' clock (support/rootless.Removals)."""
    followed = Removals(rootless_engine)
    yield followed
    followed.close()


@pytest.fixture
def user_runners(rootless_engine: RootlessEngine) -> Iterator[Callable[..., UserRunner]]:
    """Start runners of the user's on its engine; each is killed after the test."""
    made: list[UserRunner] = []

    def start(container: bool = True) -> UserRunner:
        made.append(UserRunner(rootless_engine, container=container))
        return made[-1]

    yield start
    for runner in made:
        runner.close()


def _holds(agent: Agent, runner: UserRunner, timeout: float = 30) -> None:
    """Wait until the agent's index holds the runner's container, or without one its network
    and volume: what makes the agent watch the runner."""
    parts = ("containers",) if runner.container else ("networks", "volumes")

    def held() -> bool:
        mine = [o for o in agent.status()["owners"] if o["pid"] == runner.pid]
        return bool(mine) and all(len(mine[0][p]) == 1 for p in parts)

    wait_for(held, timeout=timeout, what=f"the agent to hold runner {runner.pid}'s {parts}")


def test_sigkill_of_a_users_runner_reaps_what_it_made_on_its_rootless_engine(
    rootless_engine, rootless_agent, user_runners, removals
):
    dead, live = user_runners(), user_runners()
    for runner in (dead, live):
        _holds(rootless_agent, runner)

    at = dead.kill()
    removed = removals.when(dead.container, timeout=30)
    assert removed is not None, f"{dead.container} not removed within 30 s"
    # Its network and volume go after it; polled only once it is gone (a podman inspect of
    # a container takes its lock, and would slow the removal it waits on).
    wait_for(lambda: not dead.present(), timeout=30, what=f"{dead.things()} gone")
    took = time.time() - at
    kind = rootless_engine.kind
    print(
        f"\n{kind}: SIGKILL -> container gone {(removed - at) * 1000:.0f} ms, "
        f"-> its network and volume too {took * 1000:.0f} ms"
    )

    # A live owner's are untouched, as the user sees its engine too.
    assert live.present() == live.things()
    listed = rootless_engine.docker("ps", "-aq", "--no-trunc", "--filter", "label=exitwatch.owner")
    assert listed.stdout.split() == [live.container]
    assert rootless_agent.alive()
    assert took <= REAP_DEADLINE, f"{kind}: {took:.3f} s"


# podman 4.3 sends no event when a network is made, and a volume's create event has an
# empty Actor.ID (its name in Actor.Attributes.name): an owner with only a network and a
# volume, made after the agent started, is found by the kind's listing of networks every
# second on podman and by the volume's name (docs/podman.md).
def test_sigkill_of_a_runner_with_only_a_network_and_a_volume_reaps_them(
    rootless_engine, rootless_agent, user_runners
):
    runner = user_runners(container=False)
    _holds(rootless_agent, runner)
    took = _gone_after_kill(runner)
    print(f"\n{rootless_engine.kind}: SIGKILL -> network and volume gone: {took * 1000:.0f} ms")
    assert took <= REAP_DEADLINE, f"{rootless_engine.kind}: {took:.3f} s"


def _gone_after_kill(runner: UserRunner) -> float:
    """SIGKILL the runner; the seconds until all it made was seen gone (polled, 30 s at most)."""
    at = runner.kill()
    wait_for(lambda: not runner.present(), timeout=30, what=f"{runner.things()} gone")
    return time.time() - at


def test_reap_latency_on_a_rootless_engine_against_its_own_rm_f(
    rootless_engine, rootless_agent, user_runners, removals
):
    """Per trial, paired: the engine removing a container of the same kind on request (its
    API's DELETE ?force, and the user's `docker rm -f`), then the agent removing a killed
    runner's, each from the request (or the SIGKILL) to the engine's removal event. The
    agent's first removal on the engine is reported apart: it asks the engine's API version
    then (podman's GET /version took 0.4 to 1.2 s, before the agent read /_ping's)."""
    first = _reaped_ms(rootless_engine, rootless_agent, user_runners, removals)
    ours, api, cli = [], [], []
    for _ in range(TRIALS):
        floor_api, floor_cli = (_floor_container(rootless_engine) for _ in range(2))
        at = time.time()
        rootless_engine.docker("rm", "-f", floor_cli)
        cli.append(_ms(removals.when(floor_cli, 30), at))

        at = time.time()
        rootless_engine.client.api.remove_container(floor_api, force=True, v=True)
        api.append(_ms(removals.when(floor_api, 30), at))

        ours.append(_reaped_ms(rootless_engine, rootless_agent, user_runners, removals))

    kind = rootless_engine.kind
    print(
        f"\n{kind}: the agent's first removal, SIGKILL -> removed: {first:.0f} ms"
        f"\n{kind}, {TRIALS} trials after it, ms p50 / p95 / max:"
        f"\n  SIGKILL -> container removed (agent): {_fmt(stats.summary(ours))}"
        f"\n  engine DELETE ?force -> removed:      {_fmt(stats.summary(api))}"
        f"\n  user's docker rm -f -> removed:       {_fmt(stats.summary(cli))}"
        f"\n  agent - DELETE, per trial:           {_fmt(stats.paired(ours, api))}"
    )
    assert max(ours) <= REAP_DEADLINE * 1000, f"{kind}: SIGKILL -> removed {ours} ms"


def _reaped_ms(engine, agent, user_runners, removals) -> float:
    """A new runner of the user's, held by the agent, killed: ms to its container's removal."""
    runner = user_runners()
    _holds(agent, runner)
    at = runner.kill()
    return _ms(removals.when(runner.container, 30), at)


def _floor_container(engine: RootlessEngine) -> str:
    """A running container of the runner's kind, made by the user, owned by nobody."""
    return engine.docker("run", "-d", "--network", "none", engine.image).stdout.strip()


def _ms(end: float | None, start: float) -> float:
    assert end is not None, "not removed within 30 s"
    return (end - start) * 1000


def _fmt(summary: dict) -> str:
    return " / ".join(f"{summary[k]}" for k in ("p50", "p95", "max"))


# A root agent reads a user's engine as untrusted input (docs/design.md, "Engines are many,
# and some belong to users"): the user owns /run/user/UID and everything in it, so it can
# put a symlink where its socket should be, to a socket only root may reach. Following it,
# the agent would judge and remove on root's engine, through a path the user chose. A
# socket there, found or given (here --docker-host, as an operator would name one user's
# engine), is reached only as its user's own (url.Endpoint.parse, owned).
# The layouts: the socket itself a symlink (docker.sock), or the directory above it
# (podman/), to a root-owned directory where root's engine answers as podman.sock (a root
# podman's /run/podman), here a hard link to the suite's engine's socket.
@pytest.mark.parametrize("layout", ["socket", "directory"])
def test_a_root_agent_never_follows_a_users_symlink_to_roots_engine(engine, layout, tmp_path):
    cid = container(engine, labels={"exitwatch.owner": str(killed_owner())})
    with temporary_user() as user, _runtime_dir(user) as rundir:
        if layout == "socket":
            url, link, target = (
                f"unix://{rundir}/docker.sock",
                rundir / "docker.sock",
                engine.socket,
            )
        else:
            roots = tmp_path / "run-podman"  # root's, as /run/podman
            roots.mkdir()
            os.link(engine.socket, roots / "podman.sock")
            link, target = rundir / "podman", roots
            url = f"unix://{link}/podman.sock"
        proc = as_user(user, 'ln -s "$1" "$2"', str(target), str(link))
        assert proc.wait(timeout=30) == 0 and link.is_symlink()

        root = tmp_path / "root"
        root.mkdir()
        agents = Agents(url, root, tmp_path)
        try:
            agent = agents.start("--no-find-engines", ready=False)
            wait_for(lambda: _settled(agent), timeout=30, what="the agent to reconcile or refuse")
            gone = not exists(engine, cid)
        finally:
            agents.stop()
    assert not gone, f"the agent removed root's container through {link} -> {target}"


def _settled(agent: Agent) -> bool:
    """Whether the agent has done what it would with its engine: exited (refused to start),
    said it cannot use it, or finished its start-up reconcile (whose removals are queued
    before it says "ready:") with nothing pending."""
    if not agent.alive():
        return True
    doc = query(agent.flag("--status-socket"), timeout=5)
    if doc is None:
        return False
    if (doc.get("docker") or {}).get("last_error"):
        return True
    return "ready:" in agent.text() and not doc["pending"]


@contextlib.contextmanager
def _runtime_dir(user) -> Iterator[Path]:
    """/run/user/UID for `user`, as logind would make it (the user's, 0700); removed after."""
    path = Path(f"/run/user/{user.pw_uid}")
    path.parent.mkdir(exist_ok=True)
    path.mkdir(mode=0o700)
    os.chown(path, user.pw_uid, user.pw_gid)
    try:
        yield path
    finally:
        run(["rm", "-rf", "--one-file-system", str(path)])


def test_exitwatch_run_as_the_user_in_front_of_its_rootless_engine(
    rootless_engine: RootlessEngine, tmp_path: Path
) -> None:
    """The user runs `exitwatch run` with DOCKER_HOST at its own engine: what CMD makes
    there is labelled with the run, and a root agent that finds the user's engine removes
    it once the run is SIGKILLed."""
    root = tmp_path / "root"
    root.mkdir()
    agents = Agents(None, root, tmp_path)
    agent = agents.start("--find-engines")
    name = f"ew-userrun-{rootless_engine.kind}"
    script = (
        f"docker run -d --network none --name {name} {rootless_engine.image} sleep 1000 "
        ">/dev/null && echo made && exec sleep 1000"
    )
    argv = ("/usr/bin/python3", "-m", "exitwatch", "run", "--", "sh", "-c", script)
    wrapper = rootless_engine.user.popen(
        *argv, env={"DOCKER_HOST": rootless_engine.host}, stdout=subprocess.PIPE
    )
    try:
        assert wrapper.stdout is not None and wrapper.stdout.readline() == b"made\n"
        listed = rootless_engine.client.api.containers(all=True, filters={"name": name})
        assert listed, f"{name} is gone already; the agent's log:\n{agent.text()}"
        labels = listed[0]["Labels"]
        assert labels["exitwatch.owner"].split(":")[-2] == str(wrapper.pid)
        wait_for(
            lambda: any(o["pid"] == wrapper.pid for o in agent.status()["owners"]),
            timeout=30,
            what="the agent to hold the run's container on the user's engine",
        )
        wrapper.kill()
        wrapper.wait()
        wait_for(
            lambda: not rootless_engine.exists("container", name),
            timeout=30,
            what="the run's container gone",
        )
    finally:
        if wrapper.poll() is None:
            wrapper.kill()
            wrapper.wait()
        agents.stop()
