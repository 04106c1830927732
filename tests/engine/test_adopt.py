"""`exitwatch adopt` with a real agent and the private engine: runner containers that mount
its socket in place of /var/run/docker.sock, and host clients found by a rule. What a
runner creates carries its owner, and goes when that owner dies, with the runner's code and
command line unchanged; nothing else is touched.

The agent follows exits with the netlink source. The figures (how long after `docker kill`
nothing was left) are printed: pytest -s shows them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from exitwatch.contract import LABEL_OWNER, LABEL_OWNER_NAME

from support import tools
from support.adopt import adopting, init_owner, owned, runner_argv
from support.agentproc import GONE_DEADLINE
from support.procs import wait_for

RULE = "*exitwatch-rule-*"
# docker kill to nothing left, with the agent running: the target.
KILLED_GONE = 1.0
NOTHING: dict[str, list[str]] = {"containers": [], "networks": [], "volumes": []}

# A runner as one sees them: it makes a network, a volume and two sandboxes, the second
# with a named volume the engine would make (-v NAME:/w), then waits. Each start of its
# container is an instance of its own (N counts them), as a restarted runner's is.
RUNNER = r"""
n=$(( $(cat /n 2>/dev/null || echo 0) + 1 )); echo $n > /n; p={prefix}-$n
docker network create $p-net >/dev/null
docker volume create $p-vol >/dev/null
docker run -d --name $p-a --network $p-net -v $p-vol:/v {image} >/dev/null
docker run -d --name $p-b -v $p-named:/w {image} >/dev/null
trap 'exit 0' TERM
sleep 1000000 & wait
"""


@pytest.fixture
def adopt(engine, tmp_path):
    with adopting(engine, (RULE,), logs=tmp_path) as a:
        yield a


def _runner(engine, adopt, name: str, prefix: str) -> None:
    script = RUNNER.format(prefix=prefix, image=engine.image)
    engine.docker(*runner_argv(adopt, name, engine.image, "sh", "-c", script))


def _instance(engine, prefix: str, n: int) -> dict[str, list[str]]:
    """What instance `n` of a RUNNER made, once it has made it all, as owned() says it."""
    p = f"{prefix}-{n}"
    want = {
        "containers": [f"{p}-a", f"{p}-b"],
        "networks": [f"{p}-net"],
        "volumes": sorted([f"{p}-vol", f"{p}-named"]),
    }

    def made() -> bool:
        names = {c["Names"][0].lstrip("/") for c in engine.client.api.containers()}
        return set(want["containers"]) <= names

    wait_for(made, timeout=60, what=f"runner instance {p} to make its sandboxes")
    return want


def _gone(engine, owner: str, since: float, what: str) -> float:
    wait_for(lambda: owned(engine, owner) == NOTHING, timeout=GONE_DEADLINE, what=what)
    took = time.monotonic() - since
    print(f"\n{what}: {took:.2f} s", end="")
    return took


def test_a_killed_runner_container_leaves_nothing_and_another_runner_keeps_all(
    engine, agent, adopt
) -> None:
    _runner(engine, adopt, "runner-x", "x")
    _runner(engine, adopt, "runner-y", "y")
    x, y = _instance(engine, "x", 1), _instance(engine, "y", 1)
    # A client entered into the container from outside is the container's too.
    engine.docker("exec", "runner-x", "docker", "run", "-d", "--name", "x-exec", engine.image)
    x["containers"].append("x-exec")
    owner_x, owner_y = init_owner(engine, "runner-x"), init_owner(engine, "runner-y")
    assert owned(engine, owner_x) == x and owned(engine, owner_y) == y
    labels = engine.client.api.inspect_container("x-exec")["Config"]["Labels"]
    assert labels[LABEL_OWNER_NAME] == "container runner-x"
    assert LABEL_OWNER not in engine.client.api.inspect_container("runner-x")["Config"]["Labels"]

    # The agent holds it, and says what the owner is.
    pid_x = int(owner_x.split(":")[-2])
    agent.wait_holding(pid_x, containers=3)
    (shown,) = [o for o in agent.status()["owners"] if o["owner"] == owner_x]
    assert shown["name"] == "container runner-x"
    text = subprocess.run(
        [*agent.argv[:3], "status", "--status-socket", agent.flag("--status-socket")],
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout
    assert f"  {owner_x} (pid {pid_x}, container runner-x)" in text.splitlines()

    engine.docker("kill", "runner-x")
    # From the kill's answer: the CLI's own start, which is slow on a busy machine, is not
    # the agent's time (the container is dead once the engine answers).
    at = time.monotonic()
    took = _gone(engine, owner_x, at, "docker kill of a runner container: nothing left")
    assert owned(engine, owner_y) == y  # the other runner's, untouched
    assert took <= KILLED_GONE, f"{took:.2f} s from docker kill to nothing left"


def test_a_restarted_runner_container_loses_the_old_instance_s_and_keeps_the_new_s(
    engine, agent, adopt
) -> None:
    _runner(engine, adopt, "runner-r", "r")
    first = _instance(engine, "r", 1)
    old = init_owner(engine, "runner-r")
    assert owned(engine, old) == first
    at = time.monotonic()
    engine.docker("restart", "runner-r")
    second = _instance(engine, "r", 2)
    new = init_owner(engine, "runner-r")
    assert new != old
    _gone(engine, old, at, "docker restart of a runner container: the old instance's gone")
    assert owned(engine, new) == second
    # The agent has seen the new instance's, and leaves them to it.
    agent.wait_holding(int(new.split(":")[-2]), containers=2)
    assert owned(engine, new) == second


def test_a_process_a_rule_matches_inside_a_container_owns_what_it_makes(
    engine, agent, adopt
) -> None:
    script = f"docker run -d --name inner {engine.image} >/dev/null; exec sleep 1000000"
    engine.docker(*runner_argv(adopt, "runner-i", engine.image, "sleep", "1000000"))
    inner = subprocess.Popen(
        ["docker", "exec", "runner-i", "sh", "-c", script, "exitwatch-rule-inner"],
        env=engine.env(),
    )
    try:
        wait_for(lambda: owned_by_name(engine, "inner"), timeout=60, what="container inner")
        owner = owned_by_name(engine, "inner")
        pid = int(owner.split(":")[-2])
        assert owner != init_owner(engine, "runner-i")  # the matched process's, not the init's
        labels = engine.client.api.inspect_container("inner")["Config"]["Labels"]
        # The program and the rule, never its arguments (a label is seen by many).
        assert labels[LABEL_OWNER_NAME] == f"container runner-i: sh (rule {RULE})"
        agent.wait_holding(pid, containers=1)
        at = time.monotonic()
        os.kill(pid, signal.SIGKILL)  # the runner's process dies; its container lives on
        _gone(engine, owner, at, "a matched process in a container SIGKILLed: nothing left")
        assert engine.client.api.inspect_container("runner-i")["State"]["Running"]
    finally:
        inner.kill()
        inner.wait()


def owned_by_name(engine, name: str) -> str:
    """The owner label of container `name`, "" while it is missing or unlabelled."""
    for c in engine.client.api.containers(all=True, filters={"name": f"^/{name}$"}):
        return (c.get("Labels") or {}).get(LABEL_OWNER, "")
    return ""


def test_compose_v2_inside_a_runner_container(engine, agent, adopt, tmp_path) -> None:
    try:
        config = tools.docker_config()
    except tools.Unavailable as err:
        pytest.skip(str(err))
    work = tmp_path / "project"
    work.mkdir()
    (work / "compose.yaml").write_text(
        f"services:\n  main:\n    image: {engine.image}\n    volumes: [data:/data]\n"
        "    networks: [inner]\nnetworks:\n  inner: {}\nvolumes:\n  data: {}\n"
    )
    script = "docker compose -p cv2 up -d --wait && exec sleep 1000000"
    argv = runner_argv(adopt, "runner-c", "-v", f"{work}:/work", "-w", "/work", compose=config)
    engine.docker(*argv, engine.image, "sh", "-c", script)
    project = {"label": "com.docker.compose.project=cv2"}

    def up() -> bool:
        return bool(engine.client.api.containers(filters=project))

    wait_for(up, timeout=120, what="compose v2's project inside the runner container")
    owner = init_owner(engine, "runner-c")
    made = owned(engine, owner)
    assert made["containers"] == ["cv2-main-1"], made
    assert made["networks"] == ["cv2_inner"] and made["volumes"] == ["cv2_data"], made
    at = time.monotonic()
    engine.docker("kill", "runner-c")
    _gone(engine, owner, at, "docker kill of a runner running compose v2: nothing left")


# -- host clients ------------------------------------------------------------------------------


def _host_runner(adopt, name: str, marker: str | None, image: str) -> subprocess.Popen:
    """A host script that makes container `name` through the adopt socket and then waits;
    its command line carries `marker` (which RULE matches), or nothing a rule matches."""
    script = f"docker run -d --name {name} {image} >/dev/null; echo made; read line"
    argv = ["sh", "-c", script, *([marker] if marker else [])]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DOCKER_")}
    proc = subprocess.Popen(
        argv,
        env=env | {"DOCKER_HOST": f"unix://{adopt.listen}"},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline() == "made\n"
    return proc


def test_host_clients_a_rule_matches_are_reaped_and_others_left_alone(engine, agent, adopt) -> None:
    free = _host_runner(adopt, "host-free", None, engine.image)
    free.communicate("\n")  # the operator's own `docker run -d`, from a shell that ended
    a = _host_runner(adopt, "host-a", "exitwatch-rule-a", engine.image)
    b = _host_runner(adopt, "host-b", "exitwatch-rule-b", engine.image)
    try:
        owner_a, owner_b = owned_by_name(engine, "host-a"), owned_by_name(engine, "host-b")
        assert owner_a.split(":")[-2] == str(a.pid) and owner_b.split(":")[-2] == str(b.pid)
        labels = engine.client.api.inspect_container("host-a")["Config"]["Labels"]
        assert labels[LABEL_OWNER_NAME] == f"sh (rule {RULE})"  # none of its arguments
        assert engine.client.api.inspect_container("host-free")["Config"]["Labels"] == {}
        agent.wait_holding(a.pid, containers=1)
        agent.wait_holding(b.pid, containers=1)
        at = time.monotonic()
        a.kill()
        a.wait()
        _gone(engine, owner_a, at, "a host runner matched by a rule SIGKILLed: nothing left")
        assert owned(engine, owner_b)["containers"] == ["host-b"]  # never confused
        assert engine.client.api.inspect_container("host-free")["State"]["Running"]
        b.kill()
        b.wait()
        _gone(engine, owner_b, time.monotonic(), "the second host runner SIGKILLed")
        # The agent has handled two deaths since the unmatched client's; its container stays.
        assert engine.client.api.inspect_container("host-free")["State"]["Running"]
        assert "host-free" not in json.dumps(agent.status()["owners"])
    finally:
        for proc in (a, b):
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_status_names_a_runner_container_s_owner_without_an_agent(engine, adopt) -> None:
    """The one-shot scan (`exitwatch status` with no agent) says the same."""
    engine.docker(*runner_argv(adopt, "runner-s", engine.image, "sh", "-c", _one(engine)))
    wait_for(lambda: owned_by_name(engine, "s-sandbox"), timeout=60, what="s-sandbox")
    owner = init_owner(engine, "runner-s")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "exitwatch",
            "status",
            "--status-socket",
            "/nonexistent/status.sock",
            "--json",
        ],
        env=engine.env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    (shown,) = [o for o in json.loads(done.stdout)["owners"] if o["owner"] == owner]
    assert shown["name"] == "container runner-s"


def _one(engine) -> str:
    return f"docker run -d --name s-sandbox {engine.image} >/dev/null; exec sleep 1000000"
