"""Labelled volumes and networks carry owners as containers do, against the fake engine
(support/fakeengine.py): listed and followed as resources of the container kind ("volume:NAME",
"network:ID"), removed with a dead owner that has nothing else left, and kept where the rules
say (a live owner, exitwatch.keep=true, in use, a compose project that does not go).
engine/test_owned_volumes.py proves the same with the real engine and the agent."""

from __future__ import annotations

import pytest

from exitwatch.contract import LABEL_COMPOSE_PROJECT, LABEL_KEEP, LABEL_OWNER
from exitwatch.kinds.base import Found, Gone, Outcome, Snapshot
from exitwatch.kinds.docker import attempts
from exitwatch.kinds.docker import registration as docker
from exitwatch.kinds.docker.kind import Containers
from exitwatch.owner import Owner, owner_of

from support.fakeengine import FakeEngine
from support.procs import killed_owner, wait_for

URL = "unix:///run/fake-engine.sock"


def at(key: str) -> str:
    """A resource key of the engine at URL, as the kind scopes it (kinds/docker/kind.py)."""
    return f"{URL.removeprefix('unix://')}|{key}"


@pytest.fixture
def fake() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def kind(fake: FakeEngine, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(attempts, "RETRY_PAUSE", 0.0)
    made = Containers(URL, concurrency=4, client=fake.connect)
    yield made
    made.stop()


@pytest.fixture
def dead() -> Owner:
    return killed_owner()


def owned(owner: Owner, project: str | None = None) -> dict[str, str]:
    labels = {LABEL_OWNER: str(owner)}
    return labels | ({LABEL_COMPOSE_PROJECT: project} if project else {})


def reap(kind: Containers, owner: Owner, dry_run: bool = False) -> dict[str, Outcome]:
    """What the agent does for a dead owner: the kind's reap of what a listing holds of it."""
    held = [r for r in kind.scan().resources if r.owner == owner]
    return {o.what: o for o in kind.reap(owner, held, dry_run)}


def test_labelled_volumes_and_networks_are_listed_as_resources_of_the_kind(fake, kind, dead):
    vol = fake.add_volume("data", owned(dead, "app"))
    net = fake.add_network("net", owned(dead))
    fake.add_volume("kept", owned(dead) | {LABEL_KEEP: "true"})
    fake.add_network("bad", {LABEL_OWNER: "not-an-owner"})
    fake.add_volume("unlabelled")
    listed = {r.key: (r.owner, r.name, r.group) for r in kind.scan().resources}
    assert listed == {
        at(f"volume:{vol}"): (dead, "volume data", "app"),
        at(f"network:{net}"): (dead, "network net", None),
    }


def test_the_kind_follows_their_creates_and_destroys(fake, kind, dead):
    seen: list[object] = []
    kind.start(seen.append)
    wait_for(lambda: kind.health()["connected"], what="the kind following the fake engine")
    assert seen == [Snapshot("container", (), scopes=(at(""),))]
    fake.add_volume("scratch")  # unlabelled: asked for its labels, never told
    vol = fake.add_volume("data", owned(dead))
    net = fake.add_network("net", owned(dead))
    # Asked for on the events thread: one destroyed before is not found (its Gone comes).
    wait_for(lambda: len(seen) == 3, what="two creates")
    fake.remove_volume(vol)
    fake.remove_network(net)
    fake.remove_volume("scratch")
    wait_for(lambda: len(seen) == 6, what="three destroys")
    assert [type(c) for c in seen[1:3]] == [Found, Found]
    assert [c.resource.key for c in seen[1:3]] == [at(f"volume:{vol}"), at(f"network:{net}")]
    # A destroy says no labels: every one is told, and the agent drops those it does not hold.
    assert seen[3:] == [
        Gone("container", at(f"volume:{vol}")),
        Gone("container", at(f"network:{net}")),
        Gone("container", at("volume:scratch")),
    ]
    assert fake.called("volume") == ["scratch", vol]


def test_a_dead_owner_with_only_a_volume_and_a_network_left_loses_them(fake, kind, dead):
    fake.add_volume("data", owned(dead))
    fake.add_network("net", owned(dead))
    said = reap(kind, dead)
    assert said["volume data"].detail == said["network net"].detail == "removed"
    assert said["volume data"].key == at("volume:data")
    assert not fake.volumes_ and not fake.networks_


def test_a_dry_run_names_them_and_removes_nothing(fake, kind, dead):
    fake.add_volume("data", owned(dead))
    said = reap(kind, dead, dry_run=True)
    assert said["volume data"].detail == "dry run: would remove"
    assert "data" in fake.volumes_


def test_a_live_owners_and_kept_ones_stay(fake, kind, dead):
    live = owner_of()
    fake.add_volume("live", owned(live))
    fake.add_network("live_net", owned(live))
    fake.add_volume("kept", owned(dead) | {LABEL_KEEP: "true"})
    held = [r for r in kind.scan().resources if r.owner == live]
    said = {o.what: o for o in kind.reap(live, held, dry_run=False)}
    assert all(o.refused and "is alive" in o.detail for o in said.values()) and len(said) == 2
    assert reap(kind, dead) == {}
    assert set(fake.volumes_) == {"live", "kept"} and len(fake.networks_) == 1


def test_a_volume_in_use_by_another_owners_container_stays_and_is_tried_again(fake, kind, dead):
    fake.add_volume("shared", owned(dead))
    user = fake.add_container("other-1", owned(owner_of()), volumes=("shared",), pid=1)
    said = reap(kind, dead)
    assert not said["volume shared"].ok and not said["volume shared"].refused
    assert said["volume shared"].detail == "in use by containers: other-1"
    assert said["volume shared"].key == at("volume:shared")  # the agent retries that one
    fake.remove_container(user)
    assert reap(kind, dead)["volume shared"].detail == "removed"


def test_a_project_volume_stays_while_its_project_is_held_by_a_live_owner(fake, kind, dead):
    fake.add_volume("app_data", owned(dead, "app"))
    fake.add_container("app-web-1", owned(owner_of(), "app"))
    said = reap(kind, dead)
    assert said["volume app_data"].refused
    assert "compose project app was not removed as a whole" in said["volume app_data"].detail
    assert said["compose project app"].refused
    assert "app_data" in fake.volumes_


def test_a_project_with_nothing_left_goes_but_a_network_labelled_with_a_live_owner(
    fake, kind, dead
):
    fake.add_volume("app_data", owned(dead, "app"))
    fake.add_network("app_default", {LABEL_COMPOSE_PROJECT: "app"})
    live = fake.add_network("app_live", owned(owner_of(), "app"))
    said = reap(kind, dead)
    assert said["volume app_data"].detail == said["network app_default"].detail == "removed"
    assert said["network app_live"].refused and "live owner" in said["network app_live"].detail
    assert set(fake.networks_) == {live} and not fake.volumes_


def test_status_shows_them_under_keys_of_their_own(fake, kind, dead):
    fake.add_volume("data", owned(dead, "app"))
    net = fake.add_network("net", owned(dead))
    cid = fake.add_container("c", owned(dead))
    entries = docker.REGISTRATION.entries(list(kind.scan().resources))
    assert entries == {
        "containers": [{"id": cid, "name": "c", "project": None, "engine": URL}],
        "networks": [{"id": net, "name": "net", "project": None, "engine": URL}],
        "volumes": [{"name": "data", "project": "app", "engine": URL}],
    }
    assert docker.REGISTRATION.lines(entries)[1:] == [
        "    network net",
        "    volume data (project app)",
    ]


def test_a_project_volume_stays_while_unlabelled_containers_of_its_project_remain(fake, kind, dead):
    # A long-lived production `app` of the same name: nothing proves it the owner's.
    fake.add_volume("app_data", owned(dead, "app"))
    fake.add_container("app-db-1", {LABEL_COMPOSE_PROJECT: "app"})
    said = reap(kind, dead)
    assert said["volume app_data"].refused and "app_data" in fake.volumes_


def test_a_project_that_cannot_be_listed_fails_the_attempt(fake, kind, dead):
    fake.add_volume("app_data", owned(dead, "app"))
    held = [r for r in kind.scan().resources if r.owner == dead]
    fake.fail("containers", OSError("timed out"))
    said = {o.what: o for o in kind.reap(dead, held, dry_run=False)}
    failed = said["compose project app"]
    assert not failed.ok and not failed.refused and "timed out" in failed.detail
    assert failed.key == ""  # about the whole job: the agent tries it all again
    assert "app_data" in fake.volumes_
    assert reap(kind, dead)["volume app_data"].detail == "removed"
