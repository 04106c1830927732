"""The docker kind reads podman 4.3's answers as it reads Docker's: its events (a volume named
in its attributes alone, "remove" for Docker's "destroy"), and podman-compose's projects,
which may bear `io.podman.compose.project` alone. The events are as podman 4.3.1 sent them
(docs/podman.md); engine/test_podman.py proves the same on a real podman."""

from __future__ import annotations

import queue

from exitwatch.contract import LABEL_COMPOSE_PROJECT, LABEL_OWNER
from exitwatch.kinds.base import Found, Gone, Snapshot
from exitwatch.kinds.docker import attempts, events, follower
from exitwatch.kinds.docker.compose import (
    LABEL_CONFIG_FILES,
    LABEL_WORKING_DIR,
    project_of,
)
from exitwatch.kinds.docker.kind import Containers
from exitwatch.kinds.docker.projects import members
from exitwatch.owner import owner_of

from support.fakeengine import FakeEngine
from support.procs import killed_owner

PODMAN_PROJECT = "io.podman.compose.project"
APP = "/srv/eval-1"


def podman_event(type_: str, action: str, ident: str, **attributes: str) -> dict:
    """An event as podman 4.3's Docker API sends it."""
    attrs = {"containerExitCode": "0", "podId": ""} | attributes
    return {
        "status": action,
        "Type": type_,
        "Action": action,
        "Actor": {"ID": ident, "Attributes": attrs},
        "scope": "local",
        "time": 1796426232,
        "timeNano": 1796426232672742001,
    }


def test_a_volume_named_in_its_attributes_alone_is_found_and_gone():
    fake = FakeEngine()
    owner = owner_of()
    fake.add_volume("pvol", {LABEL_OWNER: str(owner)})
    found = events.change(fake, podman_event("volume", "create", "", name="pvol"))
    assert isinstance(found, Found) and found.resource.key == "volume:pvol"
    assert found.resource.owner == owner
    gone = events.change(fake, podman_event("volume", "remove", "", name="pvol"))
    assert gone == Gone("container", "volume:pvol")


def test_a_containers_remove_is_its_destroy():
    cid = "24e4384f9a8c" + "0" * 52
    labels = {LABEL_OWNER: str(owner_of()), "name": "pc2", "image": "localhost/x"}
    created = events.change(FakeEngine(), podman_event("container", "create", cid, **labels))
    assert isinstance(created, Found) and created.resource.key == cid
    assert events.change(FakeEngine(), podman_event("container", "remove", cid, **labels)) == Gone(
        "container", cid
    )
    # Neither "died" nor a network's "connect" (which names the container) is a change.
    assert events.change(FakeEngine(), podman_event("container", "died", cid, **labels)) is None
    assert events.change(FakeEngine(), podman_event("network", "connect", cid, name="pc2")) is None


def test_the_project_is_dockers_label_first_then_podmans():
    assert project_of({LABEL_COMPOSE_PROJECT: "a", PODMAN_PROJECT: "b"}) == "a"
    assert project_of({PODMAN_PROJECT: "b"}) == "b"
    assert project_of({LABEL_COMPOSE_PROJECT: "", PODMAN_PROJECT: "b"}) == "b"
    assert project_of({"other": "x"}) is None


def test_members_are_listed_under_either_label_once_each():
    fake = FakeEngine()
    both = fake.add_container("both", {LABEL_COMPOSE_PROJECT: "app", PODMAN_PROJECT: "app"})
    podman_only = fake.add_container("podman-only", {PODMAN_PROJECT: "app"})
    fake.add_container("other", {LABEL_COMPOSE_PROJECT: "prod", PODMAN_PROJECT: "app"})
    found = [c["Id"] for c in members(fake.containers, "app")]
    assert sorted(found) == sorted([both, podman_only])


def podman_compose(project: str) -> dict[str, str]:
    """The labels of what a podman-compose that sets its own project label alone made."""
    return {
        PODMAN_PROJECT: project,
        LABEL_WORKING_DIR: APP,
        LABEL_CONFIG_FILES: f"{APP}/compose.yml",
    }


def test_a_podman_only_project_goes_whole_with_its_network(monkeypatch):
    monkeypatch.setattr(attempts, "RETRY_PAUSE", 0.0)
    fake = FakeEngine()
    kind = Containers("unix:///run/fake-engine.sock", concurrency=4, client=fake.connect)
    dead = killed_owner()
    net = fake.add_network("app_default", podman_compose("app"))
    main = fake.add_container(
        "app_main_1", podman_compose("app") | {LABEL_OWNER: str(dead)}, networks=(net,)
    )
    side = fake.add_container("app_side_1", podman_compose("app"), networks=(net,))
    prod = fake.add_container("prod_main_1", podman_compose("prod"))
    said = {o.what: o for o in kind.remove(dead, kind.owned(dead), dry_run=False, how="test")}
    kind.stop()
    assert said[f"container {main[:12]} (app_main_1)"].detail == "removed"
    assert said[f"container {side[:12]} (app_side_1)"].detail == "removed"
    assert said["network app_default"].ok
    assert set(fake.containers_) == {prod} and not fake.networks_


def test_the_networks_of_an_engine_whose_events_leave_them_out_are_listed_again(monkeypatch):
    monkeypatch.setattr(follower, "NETWORK_POLL", 0.05)
    fake = FakeEngine()
    fake.quiet_networks = True
    kind = Containers("unix:///run/fake-engine.sock", client=fake.connect)
    changes: queue.SimpleQueue = queue.SimpleQueue()
    kind.start(changes.put)
    try:
        assert isinstance(changes.get(timeout=10), Snapshot)
        dead = killed_owner()
        net = fake.add_network("lonely", {LABEL_OWNER: str(dead)})
        found = changes.get(timeout=10)
        assert isinstance(found, Found) and found.resource.key.endswith(f"|network:{net}")
        fake.remove_network(net)
        assert changes.get(timeout=10) == Gone("container", found.resource.key)
    finally:
        kind.stop()
