"""`exitwatch adopt` in front of the private rootful podman (the `podman` fixture): host
clients that speak podman's own API (`podman --remote`, CONTAINER_HOST at adopt's socket)
get an owner each, by adopt's rules, as docker clients do: a client a rule matches owns its
pods, containers, networks and volumes, which the agent reaps once it is SIGKILLed; one that
no rule matches passes through untouched, and what it made stays."""

from __future__ import annotations

import json
import os
import subprocess

from exitwatch.contract import LABEL_OWNER
from exitwatch.owner import owner_of

from support import podmancli
from support.adopt import adopting
from support.agentproc import GONE_DEADLINE, running
from support.procs import wait_for

RULE = "*exitwatch-rule-*"
MAKES = (
    "podman pod create --name {p}-pod >/dev/null && "
    "podman run -d --pod {p}-pod --name {p}-c -v {p}-named:/d {image} >/dev/null && "
    "podman network create {p}-net >/dev/null && podman volume create {p}-vol >/dev/null && "
    "echo made; read line"
)


def _client(adopt, prefix: str, marker: str | None, image: str) -> subprocess.Popen[str]:
    """A host script that makes its things through adopt's socket with podman's own API,
    then waits; its command line carries `marker` (which RULE matches), or nothing."""
    argv = ["sh", "-c", MAKES.format(p=prefix, image=image), *([marker] if marker else [])]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DOCKER_", "CONTAINER_"))}
    proc = subprocess.Popen(
        argv,
        env=env | {"CONTAINER_HOST": f"unix://{adopt.listen}"},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline() == "made\n"
    return proc


def _owners(podman, prefix: str) -> dict[str, str | None]:
    """name -> owner label of each thing named `prefix`-..., of every kind."""
    found: dict[str, str | None] = {}
    for what, name in (("ps -a", "Names"), ("pod ps", "Name"), ("volume ls", "Name")):
        for item in json.loads(podman.podman(*what.split(), "--format", "json").stdout or "[]"):
            key = item[name][0] if name == "Names" else item[name]
            if key.startswith(f"{prefix}-"):
                found[key] = (item.get("Labels") or {}).get(LABEL_OWNER)
    for item in json.loads(podman.podman("network", "ls", "--format", "json").stdout):
        if item["name"].startswith(f"{prefix}-"):
            found[item["name"]] = (item.get("labels") or {}).get(LABEL_OWNER)
    return found


def test_podman_clients_a_rule_matches_are_reaped_and_others_left_alone(
    podman, workroot, tmp_path
) -> None:
    made = {"pod", "c", "named", "net", "vol"}
    with (
        adopting(podman, (RULE,), logs=tmp_path) as adopt,
        running(podman, workroot, tmp_path / "agent.log") as agent,
    ):
        free = _client(adopt, "free", None, podman.image)
        free.communicate("\n")  # an operator's own, from a shell that ended
        ruled = _client(adopt, "ruled", "exitwatch-rule-a", podman.image)
        try:
            owner = str(owner_of(ruled.pid))
            found = _owners(podman, "ruled")
            # The pod's infra container is the pod's, and carries its labels.
            assert {n.removeprefix("ruled-") for n in found} == made
            assert set(found.values()) == {owner}
            assert set(_owners(podman, "free").values()) == {None}
            agent.wait_holding(ruled.pid, containers=2)  # ruled-c and the pod's infra
            ruled.kill()
            ruled.wait()
            wait_for(
                lambda: _owners(podman, "ruled") == {},
                timeout=GONE_DEADLINE,
                what="the SIGKILLed client's pod, container, network and volumes reaped",
            )
            assert {n.removeprefix("free-") for n in _owners(podman, "free")} == made
        finally:
            if ruled.poll() is None:
                ruled.kill()
                ruled.wait()


def test_the_podman_cli_answers_through_adopt_as_directly(podman, tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DOCKER_", "CONTAINER_"))}
    env |= podmancli.fixed(podman)
    with adopting(podman, (RULE,), logs=tmp_path) as adopt:
        results = []
        for host in (podman.host, f"unix://{adopt.listen}"):
            results.append(
                subprocess.run(
                    ["sh", "-c", podmancli.SAME, "exitwatch-rule-a"],  # a rule's: labelled
                    env=env | {"CONTAINER_HOST": host},
                    capture_output=True,
                    text=True,
                    timeout=120,
                )
            )
    podmancli.assert_same(*results)
