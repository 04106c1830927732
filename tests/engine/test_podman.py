"""A real agent in front of a real rootful podman (the `podman` fixture: support/podman.sh),
through podman's Docker API: a SIGKILLed owner's container, network and volume go within a
second, a live owner's stay, compose projects of a dead owner go as a whole (docker-compose
and podman-compose against podman), and what was made while the agent was away, or while
podman's service was, is found by the listing at its start and at its reconnect; and
`exitwatch run` in front of podman labels what its command makes and removes it at the end.
docs/podman.md says how podman 4.3 differs from Docker, and which of it these prove."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import docker.errors
import pytest

from exitwatch import owner_labels
from exitwatch.contract import LABEL_COMPOSE_PROJECT, LABEL_OWNER
from exitwatch.owner import Owner

from support import wrapper
from support.agentproc import Agent, Agents
from support.engine import PrivatePodman
from support.procs import kill, killed_owner, spawn_owner, wait_for

# The deadline from an owner's SIGKILL to its container, network and volume all gone.
DEADLINE = 1.0
PODMAN_PROJECT = "io.podman.compose.project"


@pytest.fixture(scope="module")
def agent(podman: PrivatePodman, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agent]:
    """One agent on the podman for the whole module (an agent costs a second of CPU)."""
    top = tmp_path_factory.mktemp("podman-agent")
    (top / "root").mkdir()
    agents = Agents(podman.host, top / "root", top)
    try:
        yield agents.start()
    finally:
        agents.stop()


def gone(podman: PrivatePodman, kind: str, ident: str) -> bool:
    api = podman.client.api
    inspect = {
        "container": api.inspect_container,
        "network": api.inspect_network,
        "volume": api.inspect_volume,
    }[kind]
    try:
        inspect(ident)
    except docker.errors.NotFound:
        return True
    except docker.errors.APIError as err:
        # podman 4.3 answers 500 "... does not exist in database: no such container" for one
        # being removed at that moment.
        return "no such" in str(err.explanation)
    return False


Made = list[tuple[str, str]]  # (container, network or volume; its id or name)


def make_three(podman: PrivatePodman, name: str, labels: dict[str, str]) -> Made:
    """A running container on a network of its own with a volume, all three `labels`."""
    api = podman.client.api
    net = api.create_network(f"{name}-net", labels=labels)["Id"]
    vol = api.create_volume(f"{name}-vol", labels=labels)["Name"]
    config = api.create_host_config(binds=[f"{vol}:/data"], network_mode=f"{name}-net")
    cid = api.create_container(podman.image, labels=labels, host_config=config, name=name)["Id"]
    api.start(cid)
    return [("container", cid), ("network", net), ("volume", vol)]


def dead_labels() -> dict[str, str]:
    return {LABEL_OWNER: str(killed_owner())}


def all_gone(podman: PrivatePodman, made: Made) -> bool:
    return all(gone(podman, kind, ident) for kind, ident in made)


def wait_all_gone(podman: PrivatePodman, made: Made, what: str) -> float:
    """Seconds until every one of `made` is gone (failing after 30 s)."""
    start = time.monotonic()
    wait_for(lambda: all_gone(podman, made), timeout=30, what=what)
    return time.monotonic() - start


def test_what_was_made_while_the_agent_was_away_goes_at_its_start(
    podman: PrivatePodman, tmp_path: Path
) -> None:
    # First in the module: the module's agent, once started, follows this podman, and on
    # podman lists its networks every second; it would take the dead owner's network
    # before the container that uses it is started.
    made = make_three(podman, "before", dead_labels())
    # A network alone: podman 4.3 sends no event of a network's creation, so a listing is
    # all that finds it (docs/podman.md).
    lone = podman.client.api.create_network("lone-net", labels=dead_labels())["Id"]
    agents = Agents(podman.host, tmp_path, tmp_path)
    try:
        agents.start()
        wait_all_gone(podman, [*made, ("network", lone)], "what the start-up listing found")
    finally:
        agents.stop()


def test_a_killed_owners_container_network_and_volume_go_within_a_second(
    podman: PrivatePodman, agent: Agent
) -> None:
    doomed, living = spawn_owner(), spawn_owner()
    try:
        made = make_three(podman, "doomed", owner_labels(doomed.pid))
        kept = make_three(podman, "living", owner_labels(living.pid))
        agent.wait_holding(doomed.pid, containers=1)
        agent.wait_holding(living.pid, containers=1)
        kill(doomed)
        took = wait_all_gone(podman, made, "the killed owner's container, network and volume")
        assert took < DEADLINE, f"gone {took:.2f} s after the owner's SIGKILL"
        assert not any(gone(podman, kind, ident) for kind, ident in kept)
    finally:
        kill(living)
    wait_all_gone(podman, kept, "the second owner's, once it was killed too")


def test_a_network_alone_made_while_the_agent_runs_goes_with_its_owner(
    podman: PrivatePodman, agent: Agent
) -> None:
    # podman 4.3's events tell nothing of networks: the agent lists them (NETWORK_POLL).
    owner = spawn_owner()
    net = podman.client.api.create_network("lonely", labels=owner_labels(owner.pid))["Id"]

    def held() -> bool:
        mine = [o for o in agent.status()["owners"] if o["pid"] == owner.pid]
        return bool(mine) and [n["id"] for n in mine[0]["networks"]] == [net]

    wait_for(held, what="the agent to know of the network from its listings")
    kill(owner)
    took = wait_all_gone(podman, [("network", net)], "the killed owner's network")
    assert took < DEADLINE, f"gone {took:.2f} s after the owner's SIGKILL"


def compose_file(where: Path, owner: Owner) -> None:
    """A project of two services, the main one labelled with `owner`, a named volume, and
    the default network."""
    where.mkdir()
    (where / "docker-compose.yml").write_text(
        f"""version: "3"
services:
  main:
    image: exitwatch-test/busybox:latest
    labels:
      {LABEL_OWNER}: "{owner}"
    volumes:
      - data:/data
  side:
    image: exitwatch-test/busybox:latest
volumes:
  data:
"""
    )


def project_left(podman: PrivatePodman, project: str) -> list[str]:
    """The names of the containers and networks of `project` (either label) still there."""
    api, left = podman.client.api, []
    for key in (LABEL_COMPOSE_PROJECT, PODMAN_PROJECT):
        label = {"label": f"{key}={project}"}
        left += [c["Names"][0] for c in api.containers(all=True, filters=label)]
        left += [n["Name"] for n in api.networks(filters=label)]
    return sorted(set(left))


@pytest.mark.parametrize("tool", ["docker-compose", "podman-compose"])
def test_a_killed_owners_compose_project_goes_as_a_whole(
    podman: PrivatePodman, agent: Agent, tmp_path: Path, tool: str
) -> None:
    owner = spawn_owner()
    where = tmp_path / "app"
    compose_file(where, owner.owner)
    project = f"ew{tool[:6]}"
    if tool == "docker-compose":
        podman.compose("-p", project, "up", "-d", cwd=where)
    else:
        podman.podman_compose("-p", project, "up", "-d", cwd=where)
    listed = podman.client.api.containers(filters={"label": f"{PODMAN_PROJECT}={project}"})
    if tool == "podman-compose":  # it labels its own family, and compose's too
        assert len(listed) == 2
        assert {c["Labels"][LABEL_COMPOSE_PROJECT] for c in listed} == {project}
    before = project_left(podman, project)
    assert len(before) == 3, before  # two containers and the default network
    agent.wait_holding(owner.pid, containers=1)
    kill(owner)
    wait_for(
        lambda: not project_left(podman, project),
        timeout=30,
        what=f"{tool}'s project {project} gone as a whole",
    )
    # The named volume carries no owner: it is the project's, which compose down -v removes;
    # exitwatch removes volumes that carry the owner's label (docs/contract.md).
    assert podman.client.api.volumes(filters={"label": f"{LABEL_COMPOSE_PROJECT}={project}"})


def test_what_was_made_while_podmans_service_was_down_goes_at_the_reconnect(
    podman: PrivatePodman, agent: Agent
) -> None:
    lost, back = agent.text().count("reconnecting"), agent.text().count("answers again")
    podman.stop()
    try:
        # Made by podman itself, on the same storage, as a client of another service would.
        labels = dead_labels()
        label = f"--label={LABEL_OWNER}={labels[LABEL_OWNER]}"
        net = podman.local("network", "create", label, "away-net").stdout.strip()
        vol = podman.local("volume", "create", label, "away-vol").stdout.strip()
        cid = podman.local(
            "run", "-d", label, "--network=away-net", f"--volume={vol}:/data", podman.image
        ).stdout.strip()
        lone = podman.local("network", "create", label, "away-lone").stdout.strip()
        agent.wait_log("reconnecting", "the agent to lose podman's events stream", lost + 1)
    finally:
        podman.start()
    made = [("container", cid), ("network", net), ("volume", vol), ("network", lone)]
    wait_all_gone(podman, made, "what the listing at the reconnect found")
    agent.wait_log("answers again", "the agent to follow podman again", back + 1)


# What a run makes through `exitwatch run`'s socket, in front of podman: each labelled with
# the run (the proxy adds it to every create), then the run ends by SIGKILL.
RUN_MAKES = r"""
docker run -d --name made $IMAGE sleep 1000 >/dev/null
docker network create madenet >/dev/null
docker volume create madevol >/dev/null
docker container inspect --format '{{index .Config.Labels "exitwatch.owner"}}' made
docker network inspect --format '{{index .Labels "exitwatch.owner"}}' madenet
docker volume inspect --format '{{index .Labels "exitwatch.owner"}}' madevol
kill -9 $$
"""


def test_exitwatch_run_in_front_of_podman_labels_and_removes(
    podman: PrivatePodman, bases: Path
) -> None:
    podman.client.api.create_container(podman.image, name="outsider")
    done = wrapper.run(
        ["--", "sh", "-c", RUN_MAKES], wrapper.env_for(bases, podman, IMAGE=podman.image)
    )
    assert done.returncode == 137, done.stderr
    labels = done.stdout.split()
    assert len(labels) == 3 and len(set(labels)) == 1, done.stdout  # one owner: the run
    Owner.parse(labels[0])
    assert "exitwatch run" not in done.stderr  # nothing it could not remove
    api, owned = podman.client.api, {"label": f"{LABEL_OWNER}={labels[0]}"}
    assert api.containers(all=True, filters=owned) == []
    assert api.networks(filters=owned) == []
    assert api.volumes(filters=owned)["Volumes"] in (None, [])
    assert [c["Names"] for c in api.containers(all=True)] == [["/outsider"]]
