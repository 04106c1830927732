"""The docker kind's rules against a fake engine (support/fakeengine.py), no engine needed: a
compose project goes as a whole, unlabelled containers join it only when they are of the
owner's instance (compose.py), the owner's networks and volumes go and others' stay,
exitwatch.keep=true is exempt, and how each answer of the engine is taken: a 404 counts as
done, a refusal below 500 is final, an engine error proves nothing and is tried again; two
engines as two clients, and the proxy's volume created first. engine/test_docker.py proves
the same rules on the real engine."""

from __future__ import annotations

import inspect
import time

import pytest

from exitwatch.contract import LABEL_COMPOSE_PROJECT, LABEL_KEEP, LABEL_OWNER
from exitwatch.engine import api
from exitwatch.engine.client import Client
from exitwatch.engine.errors import NotFound
from exitwatch.engine.oneshot import OneShot
from exitwatch.kinds.base import Found, Gone, Outcome, Snapshot
from exitwatch.kinds.docker import attempts
from exitwatch.kinds.docker.attempts import EngineError
from exitwatch.kinds.docker.compose import LABEL_CONFIG_FILES, LABEL_WORKING_DIR
from exitwatch.kinds.docker.kind import Containers
from exitwatch.owner import Owner, owner_of
from exitwatch.proxy import volumes
from exitwatch.proxy.creation import Volume

from support.fakeengine import FakeEngine, refused
from support.procs import killed_owner, wait_for

URL = "unix:///run/fake-engine.sock"


def at(key: str) -> str:
    """A resource key of the engine at URL, as the kind scopes it (kinds/docker/kind.py)."""
    return f"{URL.removeprefix('unix://')}|{key}"


APP = "/srv/eval-1"


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


def owned(owner: Owner, project: str | None = None, where: str = APP) -> dict[str, str]:
    """The labels of a container `owner` made, in compose `project` brought up in `where`."""
    labels = {LABEL_OWNER: str(owner)}
    return labels | (compose(project, where) if project else {})


def compose(project: str, where: str = APP) -> dict[str, str]:
    return {
        LABEL_COMPOSE_PROJECT: project,
        LABEL_WORKING_DIR: where,
        LABEL_CONFIG_FILES: f"{where}/compose.yml",
    }


def reap(kind: Containers, owner: Owner, dry_run: bool = False) -> list[Outcome]:
    return kind.remove(owner, kind.owned(owner), dry_run=dry_run, how="test")


def by_what(outcomes: list[Outcome]) -> dict[str, Outcome]:
    return {o.what: o for o in outcomes}


# -- compose projects ------------------------------------------------------------------------


def test_a_dead_owners_project_goes_whole_with_its_networks_and_volumes(fake, kind, dead):
    net = fake.add_network("app_default", compose("app"))
    other_net = fake.add_network("prod_default", compose("prod", "/srv/prod"))
    vol = fake.add_volume("app_data", owned(dead, "app"))
    fake.add_volume("someone_elses", owned(owner_of()))
    web = fake.add_container("app-web-1", owned(dead, "app"), networks=(net,), volumes=(vol,))
    # Recreated without its labels (benchflow's restore()): of the same instance, and younger.
    db = fake.add_container("app-db-1", compose("app"), networks=(net,))
    prod = fake.add_container("prod-web-1", compose("prod", "/srv/prod"), networks=(other_net,))
    said = by_what(reap(kind, dead))
    assert said["container " + web[:12] + " (app-web-1)"].detail == "removed"
    assert said["container " + db[:12] + " (app-db-1)"].detail == "removed"
    assert said["network app_default"].ok and said["volume app_data"].ok
    assert set(fake.containers_) == {prod}
    assert set(fake.networks_) == {other_net}
    assert set(fake.volumes_) == {"someone_elses"}
    assert all(o.ok and not o.refused for o in said.values())


def test_an_unlabelled_container_of_another_instance_stays_and_so_does_the_network(
    fake, kind, dead
):
    net = fake.add_network("app_default", compose("app"))
    web = fake.add_container("app-web-1", owned(dead, "app"), networks=(net,))
    # The same project name, brought up elsewhere: a production `app`, not the eval's.
    prod = fake.add_container("app-web-2", compose("app", "/srv/prod"), networks=(net,))
    said = reap(kind, dead)
    assert set(fake.containers_) == {prod} and set(fake.networks_) == {net}
    refusals = {o.what: o.detail for o in said if o.refused}
    assert "are not its owner's" in refusals[f"container {prod[:12]} (app-web-2)"]
    assert "app-web-2" in refusals["compose project app"]
    assert web not in fake.containers_


def test_an_unlabelled_container_older_than_its_owner_stays(fake, kind, dead):
    fake.add_container("app-web-1", owned(dead, "app"))
    old = fake.add_container("app-db-1", compose("app"), created=time.time() - 3600)
    said = by_what(reap(kind, dead))
    assert set(fake.containers_) == {old}
    refusal = said[f"container {old[:12]} (app-db-1)"]
    assert refusal.refused and "created before its owner started" in refusal.detail
    assert fake.called("inspect") == [old]


def test_a_live_owner_in_the_project_keeps_it_from_going_whole(fake, kind, dead):
    net = fake.add_network("app_default", compose("app"))
    mine = fake.add_container("app-web-1", owned(dead, "app"), networks=(net,))
    live = fake.add_container("app-worker-1", owned(owner_of(), "app"), networks=(net,))
    unlabelled = fake.add_container("app-db-1", compose("app"), networks=(net,))
    said = reap(kind, dead)
    assert mine not in fake.containers_
    assert set(fake.containers_) == {live, unlabelled} and net in fake.networks_
    (project,) = [o for o in said if o.what == "compose project app"]
    assert project.refused and "held by live owner" in project.detail


# -- keep=true ---------------------------------------------------------------------------------


def test_keep_true_is_exempt_in_a_project_gone_whole(fake, kind, dead):
    keep = {LABEL_KEEP: "true"}
    net = fake.add_network("app_default", compose("app") | keep)
    kept = fake.add_container("app-web-1", owned(dead, "app") | keep, networks=(net,))
    gone = fake.add_container("app-db-1", owned(dead, "app"), networks=(net,))
    assert [r.key for r in kind.scan().resources] == [at(gone)]
    reap(kind, dead)
    assert set(fake.containers_) == {kept} and net in fake.networks_


def test_keep_true_networks_and_volumes_of_the_owner_stay(fake, kind, dead):
    keep = {LABEL_KEEP: "true"}
    net = fake.add_network("kept_net", owned(dead) | keep)
    vol = fake.add_volume("kept_data", owned(dead) | keep)
    fake.add_network("net", owned(dead))
    fake.add_volume("data", owned(dead))
    fake.add_container("c", owned(dead))
    said = by_what(reap(kind, dead))
    assert said["network net"].detail == said["volume data"].detail == "removed"
    assert set(fake.networks_) == {net} and set(fake.volumes_) == {vol}
    assert not fake.containers_


def test_networks_and_volumes_in_use_by_anyone_stay_and_are_tried_again(fake, kind, dead):
    net = fake.add_network("shared", owned(dead))
    vol = fake.add_volume("shared_data", owned(dead))
    other = fake.add_container("someone", networks=(net,), volumes=(vol,))
    fake.add_container("mine", owned(dead))
    said = by_what(reap(kind, dead))
    # A failed attempt, not a refusal: the container may go, and the agent tries again.
    for what in ("network shared", "volume shared_data"):
        assert not said[what].ok and not said[what].refused, said[what]
        assert said[what].detail == "in use by containers: someone"
    assert other in fake.containers_ and net in fake.networks_ and vol in fake.volumes_


def test_a_dry_run_removes_nothing(fake, kind, dead):
    fake.add_network("app_default", compose("app"))
    fake.add_container("app-web-1", owned(dead, "app"))
    said = reap(kind, dead, dry_run=True)
    assert said and all(o.detail == "dry run: would remove" for o in said)
    assert fake.called("remove_container") == fake.called("remove_network") == []


# -- what the engine answers ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("errors", "calls", "ok", "detail"),
    [
        ([NotFound(404, "Not Found", "No such container")], 1, True, "already gone"),
        ([refused(400, "bad parameter")], 1, False, "bad parameter (HTTP 400)"),
        ([refused(409, "removal in progress")], 2, True, "removed"),
        ([refused(500, "disk full")], 2, True, "removed"),
        ([refused(500, "disk full")] * 3, 3, False, "disk full (HTTP 500), after 3 tries"),
        ([TimeoutError("timed out")] * 3, 3, False, "timed out, after 3 tries"),
        ([ConnectionRefusedError(111, "Connection refused")], 2, True, "removed"),
    ],
)
def test_each_answer_to_a_removal_is_taken_as_it_proves(
    fake, kind, dead, errors, calls, ok, detail
):
    cid = fake.add_container("c", owned(dead))
    fake.fail("remove_container", *errors)
    (outcome,) = reap(kind, dead)
    assert (outcome.ok, outcome.detail) == (ok, detail)
    assert fake.called("remove_container") == [cid] * calls
    assert (cid in fake.containers_) == (not ok or detail == "already gone")


def test_a_project_that_cannot_be_listed_is_a_failure_not_a_removal(fake, kind, dead):
    cid = fake.add_container("app-web-1", owned(dead, "app"))
    resources = kind.owned(dead)
    fake.fail("containers", OSError("the engine's answer was cut short"))
    (outcome,) = kind.remove(dead, resources, dry_run=False, how="test")
    assert not outcome.ok and "listing compose project app" in outcome.detail
    assert cid in fake.containers_ and fake.called("remove_container") == []


def test_removals_are_bounded_by_the_kinds_concurrency(fake, kind, dead):
    for n in range(8):
        fake.add_container(f"c{n}", owned(dead))
    fake.slow("remove_container", 0.05)
    said = reap(kind, dead)
    assert len(said) == 8 and all(o.ok for o in said) and not fake.containers_
    assert 1 < fake.most_in_flight <= 4


def test_an_engine_that_refuses_connections_is_named_and_proves_nothing(fake, kind, dead):
    fake.add_container("c", owned(dead))
    fake.down = True
    problem = kind.ping()
    assert problem == f"no Docker engine answers at {URL}: Connection refused"
    with pytest.raises(EngineError, match="Connection refused"):
        kind.scan()
    with pytest.raises(EngineError):
        kind.owned(dead)


def test_a_label_that_is_not_an_owner_is_skipped(fake, kind, dead):
    fake.add_container("bad", {LABEL_OWNER: "not-an-owner"})
    good = fake.add_container("good", owned(dead))
    assert [(r.key, r.owner) for r in kind.scan().resources] == [(at(good), dead)]


# -- following the engine --------------------------------------------------------------------


def test_the_kind_follows_creates_and_destroys_and_says_when_the_engine_goes(fake, kind, dead):
    first = fake.add_container("first", owned(dead))
    seen: list[object] = []
    kind.start(seen.append)
    wait_for(lambda: kind.health()["connected"], what="the kind following the fake engine")
    (snap,) = seen
    assert isinstance(snap, Snapshot) and [r.key for r in snap.resources] == [at(first)]
    fake.add_container("unlabelled")  # not of the label: never told
    fake.add_volume("unlabelled")  # asked for its labels, and not told of either
    second = fake.add_container("second", owned(dead))
    fake.remove_container(first)
    wait_for(lambda: len(seen) == 3, what="a create and a destroy")
    assert isinstance(seen[1], Found) and seen[1].resource.key == at(second)
    assert seen[2] == Gone("container", at(first))
    assert fake.called("volume") == ["unlabelled"]
    # The engine goes: the stream ends, and no reconnect is answered.
    fake.down = True
    fake.hang_up()
    wait_for(lambda: not kind.health()["connected"], what="the kind to see the engine gone")
    wait_for(lambda: kind.health()["last_error"] == "Connection refused", what="why, in one line")


# -- the fake is the interface -----------------------------------------------------------------


@pytest.mark.parametrize("impl", [FakeEngine, Client])
def test_the_fake_and_the_client_make_exactly_the_interfaces_calls(impl: type) -> None:
    calls = {name for name in vars(api.Engine) if not name.startswith("_")}
    assert calls >= {"containers", "events", "inspect", "remove_container", "remove_volume"}
    for name in calls:
        want = inspect.signature(getattr(api.Engine, name)).parameters
        assert list(inspect.signature(getattr(impl, name)).parameters) == list(want), name


# -- several engines, the proxy's calls ------------------------------------------------------


def test_two_engines_are_two_clients_each_reaping_its_own(dead, monkeypatch) -> None:
    monkeypatch.setattr(attempts, "RETRY_PAUSE", 0.0)
    one, two = FakeEngine(), FakeEngine()
    first = Containers("unix:///run/one.sock", client=one.connect)
    second = Containers("unix:///run/user/1000/docker.sock", client=two.connect)
    try:
        one.add_container("a", owned(dead))
        kept = two.add_container("b", owned(dead))
        two.down = True  # the other engine going changes nothing here
        assert all(o.ok for o in reap(first, dead)) and not one.containers_
        assert second.ping() is not None and kept in two.containers_
        assert first.health()["endpoint"] == "unix:///run/one.sock"
    finally:
        first.stop()
        second.stop()


def test_the_proxy_labels_only_the_volumes_it_creates_and_passes_refusals_on(fake) -> None:
    fake.add_volume("pre")
    labels = {LABEL_OWNER: "o"}
    assert volumes.create(fake, Volume("pre", labels=labels)) is None
    assert volumes.create(fake, Volume("made", labels=labels)) is None
    assert fake.volumes_["pre"]["Labels"] == {} and fake.volumes_["made"]["Labels"] == labels
    fake.fail("create_volume", refused(400, "bad driver"), OSError("timed out"))
    said = "volume 'x', created first to label it: bad driver"
    assert volumes.create(fake, Volume("x", driver="nope")) == (400, said)
    gone = volumes.create(fake, Volume("x"))
    assert gone == (502, "the engine did not answer a create of volume 'x': timed out")
    assert "x" not in fake.volumes_


@pytest.mark.parametrize("impl", [FakeEngine, OneShot])
def test_the_fake_and_the_proxys_client_make_exactly_its_calls(impl: type) -> None:
    for name in ("create_volume", "inspect"):
        want = inspect.signature(getattr(api.Proxying, name)).parameters
        assert list(inspect.signature(getattr(impl, name)).parameters) == list(want), name
