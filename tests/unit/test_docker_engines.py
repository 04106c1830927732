"""The container kind over several engines, against fake ones (support/fakeengine.py): each
engine's listing is the truth of that engine alone, removals go to the engine that holds
each resource, one engine that stalls holds up no other, and engines found on the host are
followed once each as they appear. tests/engine/test_engines.py does it with real ones."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time

import pytest

from exitwatch.agent.index import Index
from exitwatch.agent.reconcile import Periodic, Scanned
from exitwatch.contract import LABEL_OWNER
from exitwatch.engine.host import Found as FoundEngine
from exitwatch.engine.url import Endpoint
from exitwatch.kinds.base import Change, Found, Resource, Snapshot
from exitwatch.kinds.docker import attempts
from exitwatch.kinds.docker.attempts import EngineError
from exitwatch.kinds.docker.kind import Containers
from exitwatch.owner import Owner

from support.fakeengine import FakeEngine
from support.procs import killed_owner, wait_for

ONE, TWO = "unix:///run/one.sock", "unix:///run/user/1000/docker.sock"


def at(url: str, key: str) -> str:
    return f"{url.removeprefix('unix://')}|{key}"


@pytest.fixture
def fakes(monkeypatch: pytest.MonkeyPatch) -> dict[str, FakeEngine]:
    monkeypatch.setattr(attempts, "RETRY_PAUSE", 0.0)
    return {ONE: FakeEngine(), TWO: FakeEngine()}


def connect(fakes: dict[str, FakeEngine]):
    return lambda endpoint, timeout, concurrency: fakes[endpoint.url].connect(
        endpoint, timeout, concurrency
    )


@pytest.fixture
def kind(fakes: dict[str, FakeEngine]):
    made = Containers(engines=(ONE, TWO), concurrency=4, client=connect(fakes))
    yield made
    made.stop()


def labels(owner: Owner) -> dict[str, str]:
    return {LABEL_OWNER: str(owner)}


def test_a_listing_is_each_engines_whole_truth_and_nothing_of_another(fakes, kind) -> None:
    dead = killed_owner()
    a = fakes[ONE].add_container("a", labels(dead))
    b = fakes[TWO].add_container("b", labels(dead))
    fakes[TWO].add_volume("data", labels(dead))
    fakes[ONE].add_volume("data", labels(dead))  # the same name on two engines: two volumes
    snap = kind.scan()
    assert snap.scopes == (at(ONE, ""), at(TWO, ""))
    assert sorted(r.key for r in snap.resources) == sorted(
        [at(ONE, a), at(ONE, "volume:data"), at(TWO, b), at(TWO, "volume:data")]
    )


def test_an_engine_that_does_not_answer_leaves_the_others_listed(fakes, kind, caplog) -> None:
    dead = killed_owner()
    a = fakes[ONE].add_container("a", labels(dead))
    fakes[TWO].add_container("b", labels(dead))
    fakes[TWO].down = True
    with caplog.at_level(logging.WARNING):
        snap = kind.scan()
    assert snap.scopes == (at(ONE, ""),)  # says nothing of TWO's
    assert [r.key for r in snap.resources] == [at(ONE, a)]
    assert [r.getMessage() for r in caplog.records if "cannot list" in r.getMessage()]
    fakes[ONE].down = True
    with pytest.raises(EngineError, match=r"one\.sock.*docker\.sock"):
        kind.scan()


def test_removals_go_to_each_engine_and_say_which(fakes, kind) -> None:
    dead = killed_owner()
    a = fakes[ONE].add_container("a", labels(dead))
    b = fakes[TWO].add_container("b", labels(dead))
    held = list(kind.scan().resources)
    outcomes = kind.reap(dead, held, dry_run=False)
    assert all(o.ok for o in outcomes)
    assert {(o.extra["id"], o.extra["engine"]) for o in outcomes} == {(a, ONE), (b, TWO)}
    assert not fakes[ONE].containers_ and not fakes[TWO].containers_


def test_an_engine_that_stalls_holds_up_no_other_engines_removal(fakes, kind) -> None:
    dead = killed_owner()
    fakes[ONE].add_container("a", labels(dead))
    fakes[TWO].add_container("b", labels(dead))
    held = list(kind.scan().resources)
    fakes[ONE].slow("remove_container", 3.0)
    started = time.monotonic()
    reaping = threading.Thread(target=kind.reap, args=(dead, held, False))
    reaping.start()
    wait_for(lambda: not fakes[TWO].containers_, what="the other engine's container removed")
    assert time.monotonic() - started < 2.0
    assert fakes[ONE].containers_  # still under way on the slow one
    reaping.join(30)


def test_engines_found_are_followed_once_each_as_they_appear(fakes, tmp_path) -> None:
    # A socket there, of this user: what the finder takes (engine/host.py); the fake
    # answers for it.
    path = str(tmp_path / "docker.sock")
    listening = socket.socket(socket.AF_UNIX)
    listening.bind(path)
    user = Endpoint.owned(path, os.getuid())
    fakes[user.url] = fakes.pop(TWO)
    found: list[FoundEngine] = []
    looks: list[int] = []
    failing: list[OSError] = []

    def finder() -> list[FoundEngine]:
        looks.append(len(found))
        if failing:
            raise failing[0]
        return list(found)

    kind = Containers(ONE, client=connect(fakes), find=True, finder=finder)
    seen: list[Change] = []
    dead = killed_owner()
    b = fakes[user.url].add_container("b", labels(dead))
    try:
        kind.start(seen.append)
        wait_for(lambda: any(isinstance(c, Snapshot) for c in seen), what="ONE's listing")
        found += [FoundEngine(user, "rootless Docker of uid 1000")] * 2
        mine = (at(user.url, ""),)
        wait_for(
            lambda: any(isinstance(c, Snapshot) and c.scopes == mine for c in seen),
            what="the found engine's own listing",
        )
        [snap] = [c for c in seen if isinstance(c, Snapshot) and c.scopes == mine]
        assert [r.key for r in snap.resources] == [at(user.url, b)]
        wait_for(lambda: kind.health()["engines"][1]["connected"], what="TWO followed")
        # It is found again at each look, and stays one engine.
        wait_for(lambda: looks.count(2) >= 2, what="two more looks", timeout=10)
        engines = kind.health()["engines"]
        assert [(e["endpoint"], e["how"]) for e in engines] == [
            (ONE, "configured"),
            (user.url, "rootless Docker of uid 1000"),
        ]
        assert engines[1]["resources"] == 1
        fakes[user.url].add_container("c", labels(dead))
        wait_for(
            lambda: any(isinstance(c, Found) and c.resource.key.startswith(mine) for c in seen),
            what="a create on the found engine",
        )
        # A look that fails (a full fd table) proves nothing: the engine stays followed, and
        # nothing of it is forgotten.
        failing.append(OSError(24, "Too many open files"))
        before = len(looks)
        wait_for(lambda: len(looks) >= before + 2, what="two failed looks", timeout=10)
        assert len(kind.health()["engines"]) == 2
        assert not [
            c for c in seen if isinstance(c, Snapshot) and c.scopes == mine and not c.resources
        ]
    finally:
        kind.stop()
        listening.close()


def _res(url: str, key: str, owner: Owner) -> Resource:
    return Resource("container", at(url, key), owner)


def test_the_index_replaces_only_the_scopes_a_listing_covers() -> None:
    one, two = killed_owner(), killed_owner()
    index = Index()
    index.add(_res(ONE, "a", one))
    index.add(_res(TWO, "b", two))
    added, left = index.replace_kind("container", (), (at(ONE, ""),))
    assert left == {one} and not added
    assert index.owners() == [two]  # TWO's listing was not this one


def test_a_reconcile_drops_only_the_scopes_a_watcher_told_of_since() -> None:
    one, two = killed_owner(), killed_owner()
    periodic = Periodic(60, [])
    periodic.start(lambda item: None)
    periodic.tick(time.monotonic() + 120)  # a scan under way (of no kinds)
    periodic.replaced("container", (at(ONE, ""),))  # ONE's watcher reconnected meanwhile
    listed = Snapshot(
        "container",
        (_res(ONE, "a", one), _res(TWO, "b", two)),
        scopes=(at(ONE, ""), at(TWO, "")),
    )
    [merged] = periodic.merge(Scanned(1, (listed,), (), 0.0))
    assert merged.scopes == (at(TWO, ""),)
    assert [r.key for r in merged.resources] == [at(TWO, "b")]
