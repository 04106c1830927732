"""What the labelling sockets (`exitwatch adopt`'s and `exitwatch run`'s) leave unowned
(issue 30): an `exitwatch.owner` label that names nobody (compose's "${EXITWATCH_OWNER}"
where the variable is unset gives "") is replaced by the real owner, and what it labels
goes with that owner; a legacy build's intermediate containers, which no label can reach,
are never left behind, whatever `rm` the client sent (docker-py sends rm=False), after the
build nor after its owner's death mid-build."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from exitwatch.contract import LABEL_OWNER

from support.adopt import adopting, init_owner, owned, runner_argv
from support.agentproc import GONE_DEADLINE
from support.procs import wait_for
from support.wrapper import RUN, env_for, run

RULE = "*exitwatch-rule-*"
RULED = "exitwatch-rule-build"  # on a build's command line: adopt's rule matches it
NOTHING: dict[str, list[str]] = {"containers": [], "networks": [], "volumes": []}

# A runner that labels as the contract's compose example does, where nothing set the
# variable, and as a typo would.
BAD_LABELS = r"""
docker run -d --name $P-c --label "exitwatch.owner=${EXITWATCH_OWNER}" $IMAGE sleep 1000 >/dev/null
docker network create --label exitwatch.owner= $P-n >/dev/null
docker volume create --label exitwatch.owner=not-an-owner $P-v >/dev/null
echo made
"""


def _env(engine, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DOCKER_", "EXITWATCH_"))}
    return env | {"IMAGE": engine.image} | extra


def test_adopt_replaces_an_owner_label_that_names_nobody(engine, agent, tmp_path) -> None:
    with adopting(engine, (RULE,), logs=tmp_path) as adopt:
        script = f"P=bad; IMAGE={engine.image}\n{BAD_LABELS}sleep 1000000"
        engine.docker(*runner_argv(adopt, "bad-runner", engine.image, "sh", "-c", script))
        want = {"containers": ["bad-c"], "networks": ["bad-n"], "volumes": ["bad-v"]}
        owner = init_owner(engine, "bad-runner")
        wait_for(lambda: owned(engine, owner) == want, timeout=60, what="the runner's three")
        agent.wait_holding(int(owner.split(":")[-2]), containers=1)
        engine.docker("kill", "bad-runner")
        wait_for(lambda: owned(engine, owner) == NOTHING, timeout=GONE_DEADLINE, what="reaped")
        names = [c["Names"][0] for c in engine.client.api.containers(all=True)]
        assert "/bad-c" not in names


def test_run_replaces_an_owner_label_that_names_nobody(engine, bases) -> None:
    script = f"P=run-bad\n{BAD_LABELS}kill -9 $$"
    env = env_for(bases, engine, IMAGE=engine.image, EXITWATCH_OWNER="")
    done = run(["--", "sh", "-c", script], env)
    assert done.returncode == 137 and "made" in done.stdout, done.stderr
    api = engine.client.api
    # The run removes what carries its owner: nothing of it is left, labelled or not.
    assert [c["Names"] for c in api.containers(all=True, filters={"name": "run-bad"})] == []
    assert api.networks(names=["run-bad-n"]) == []
    assert [v["Name"] for v in api.volumes()["Volumes"] or [] if v["Name"] == "run-bad-v"] == []


# -- builds -------------------------------------------------------------------------------------

SDK_BUILD = r"""
import os, sys, docker
client = docker.DockerClient(base_url=os.environ["DOCKER_HOST"], version="auto", timeout=300)
client.images.build(path=sys.argv[1], tag=sys.argv[2], rm=False)
print("built")
"""


def _context(tmp_path: Path, name: str, image: str, wait: bool = False) -> Path:
    """A build context whose steps run in containers, never in the cache: two RUN steps, or
    one that waits."""
    ctx = tmp_path / name
    ctx.mkdir()
    steps = "RUN sleep 1000\n" if wait else "RUN echo one > /one\nRUN echo two > /two\n"
    ctx.joinpath("Dockerfile").write_text(f"FROM {image}\nRUN echo {uuid.uuid4()}\n{steps}")
    return ctx


def _containers(engine) -> set[str]:
    return {c["Id"] for c in engine.client.api.containers(all=True)}


def _unowned_since(engine, before: set[str]) -> list[str]:
    """Containers made since `before` that carry no owner label."""
    api = engine.client.api
    return [
        (c["Names"] or ["?"])[0]
        for c in api.containers(all=True)
        if c["Id"] not in before and LABEL_OWNER not in (c.get("Labels") or {})
    ]


def _builds(engine, tmp_path: Path, socket_env: dict[str, str], argv0: list[str]) -> None:
    """A build by docker-py (rm=False) and by the CLI (--rm=false), through the socket that
    `socket_env` names, each started by `argv0` + its command: nothing is left."""
    before = _containers(engine)
    sdk = _context(tmp_path, "sdk", engine.image)
    done = subprocess.run(
        [*argv0, sys.executable, "-c", SDK_BUILD, str(sdk), "exitwatch-built-sdk", RULED],
        env=socket_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0 and "built" in done.stdout, done.stderr
    cli = _context(tmp_path, "cli", engine.image)
    script = f"docker build --rm=false -q -t exitwatch-built-cli {cli} >/dev/null && echo built"
    done = subprocess.run(
        [*argv0, "sh", "-c", script, RULED],
        env=socket_env | {"DOCKER_BUILDKIT": "0"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0 and "built" in done.stdout, done.stderr
    assert _unowned_since(engine, before) == []

    # The owner killed while a step runs: the step's container goes with the build.
    before = _containers(engine)
    slow = _context(tmp_path, "slow", engine.image, wait=True)
    script = f"docker build --rm=false -t exitwatch-built-slow {slow}; sleep 1000"
    proc = subprocess.Popen(
        [*argv0, "sh", "-c", script, RULED],
        env=socket_env | {"DOCKER_BUILDKIT": "0"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:

        def sleeping() -> bool:
            running = engine.client.api.containers(filters={"status": "running"})
            return any(c["Id"] not in before and "sleep 1000" in c["Command"] for c in running)

        wait_for(sleeping, timeout=120, what="the build's waiting step")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    at = time.monotonic()
    wait_for(lambda: not _unowned_since(engine, before), timeout=30, what="no unowned container")
    print(f"\nbuild's owner killed: its step's container gone in {time.monotonic() - at:.2f} s")


def test_builds_through_adopt_leave_no_container_behind(engine, tmp_path) -> None:
    with adopting(engine, (RULE,), logs=tmp_path) as adopt:
        env = _env(engine, DOCKER_HOST=f"unix://{adopt.listen}")
        _builds(engine, tmp_path, env, [])


def test_builds_through_a_run_leave_no_container_behind(engine, bases, tmp_path) -> None:
    env = env_for(bases, engine)
    _builds(engine, tmp_path, env, [*RUN, "--"])
