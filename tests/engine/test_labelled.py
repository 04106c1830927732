"""Networks and volumes labelled with an owner go with its containers, on the real engine."""

from __future__ import annotations

import docker.errors

from exitwatch.contract import LABEL_COMPOSE_PROJECT, LABEL_KEEP, LABEL_OWNER
from exitwatch.kinds.docker.kind import Containers
from exitwatch.owner import Owner

from support.engine import PrivateEngine
from support.procs import killed_owner


def present(engine: PrivateEngine, kind: str, name: str) -> bool:
    api = engine.client.api
    try:
        (api.inspect_network if kind == "network" else api.inspect_volume)(name)
    except docker.errors.NotFound:
        return False
    return True


def make(engine: PrivateEngine, name: str, labels: dict[str, str], net: str, vol: str) -> str:
    api = engine.client.api
    host = api.create_host_config(binds={vol: {"bind": "/v", "mode": "rw"}}, network_mode=net)
    return api.create_container(
        engine.image, "sleep 1000", name=name, labels=labels, host_config=host
    )["Id"]


def test_a_dead_owners_networks_and_volumes_go_with_its_containers(
    engine: PrivateEngine, kind: Containers, live_owner: Owner
) -> None:
    api = engine.client.api
    dead = killed_owner()
    mine = {LABEL_OWNER: str(dead)}
    api.create_network("deadnet", labels=mine)
    api.create_volume("deadvol", labels=mine)
    api.create_network("keptnet", labels=mine | {LABEL_KEEP: "true"})
    api.create_network("livenet", labels={LABEL_OWNER: str(live_owner)})
    api.create_volume("livevol", labels={LABEL_OWNER: str(live_owner)})
    make(engine, "held", mine, "deadnet", "deadvol")

    outcomes = kind.reap(dead, kind.owned(dead), dry_run=False)

    said = {o.what: (o.ok, o.detail) for o in outcomes}
    assert said["network deadnet"] == (True, "removed")
    assert said["volume deadvol"] == (True, "removed")
    assert not present(engine, "network", "deadnet") and not present(engine, "volume", "deadvol")
    assert "network keptnet" not in said and present(engine, "network", "keptnet")
    assert present(engine, "network", "livenet") and present(engine, "volume", "livevol")


def test_they_stay_while_a_container_of_the_owner_remains(
    engine: PrivateEngine, kind: Containers
) -> None:
    api = engine.client.api
    dead = killed_owner()
    mine = {LABEL_OWNER: str(dead)}
    api.create_network("deadnet", labels=mine)
    api.create_volume("deadvol", labels=mine)
    make(engine, "kept", mine | {LABEL_KEEP: "true"}, "deadnet", "deadvol")

    outcomes = kind.reap(dead, [], dry_run=False)

    said = {o.what: (o.ok, o.refused, o.detail) for o in outcomes}
    why = "containers of the owner remain: kept"
    assert said == {"network deadnet": (False, True, why), "volume deadvol": (False, True, why)}
    assert present(engine, "network", "deadnet") and present(engine, "volume", "deadvol")


def test_a_live_owner_is_refused_but_an_ended_run_is_not(
    engine: PrivateEngine, kind: Containers, live_owner: Owner
) -> None:
    api = engine.client.api
    mine = {LABEL_OWNER: str(live_owner)}
    api.create_network("runnet", labels=mine)
    make(engine, "runner", mine, "runnet", "runvol")
    held = kind.owned(live_owner)
    assert [r.name for r in held] == ["runner"]

    assert all(o.refused for o in kind.reap(live_owner, held, dry_run=False))
    assert present(engine, "network", "runnet")
    # `exitwatch run` is the owner, alive, when its command and descendants have ended.
    outcomes = kind.remove(live_owner, held, dry_run=False, how="the run ended")
    assert all(o.ok for o in outcomes) and len(outcomes) == 2
    assert kind.owned(live_owner) == [] and not present(engine, "network", "runnet")


def test_one_used_by_any_other_container_stays(engine: PrivateEngine, kind: Containers) -> None:
    # A stopped container of no owner would lose its network; a running one makes the
    # engine refuse (403). It stays, and the attempt fails, to be tried again later.
    api = engine.client.api
    dead = killed_owner()
    mine = {LABEL_OWNER: str(dead)}
    api.create_network("sharednet", labels=mine)
    api.create_volume("sharedvol", labels=mine)
    api.start(make(engine, "stranger", {}, "sharednet", "sharedvol"))

    outcomes = kind.reap(dead, [], dry_run=False)

    said = {o.what: (o.ok, o.refused, o.detail) for o in outcomes}
    why = "in use by containers: stranger"
    assert said == {
        "network sharednet": (False, False, why),
        "volume sharedvol": (False, False, why),
    }
    assert present(engine, "network", "sharednet") and present(engine, "volume", "sharedvol")


def test_those_of_a_project_not_removed_whole_stay(
    engine: PrivateEngine, kind: Containers, live_owner: Owner
) -> None:
    api = engine.client.api
    dead = killed_owner()
    project = {LABEL_COMPOSE_PROJECT: "evalproj"}
    mine = {LABEL_OWNER: str(dead)} | project
    api.create_network("evalproj_default", labels=mine)
    make(engine, "evalproj_db_1", mine, "evalproj_default", "evalvol")
    # The live owner's container of the project uses another network: only the project
    # rule, not the in-use check, keeps evalproj_default.
    make(engine, "evalproj_web_1", {LABEL_OWNER: str(live_owner)} | project, "bridge", "webvol")

    outcomes = kind.reap(dead, kind.owned(dead), dry_run=False)

    said = {o.what: (o.ok, o.refused, o.detail) for o in outcomes}
    why = "compose project evalproj was not removed as a whole"
    assert said["network evalproj_default"] == (False, True, why)
    assert said["compose project evalproj"][:2] == (False, True)
    assert present(engine, "network", "evalproj_default")
