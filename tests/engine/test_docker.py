"""The container kind against the suite's private Docker engine."""

from __future__ import annotations

import logging
import queue
import threading
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import docker.errors
import pytest

from exitwatch.contract import LABEL_COMPOSE_PROJECT, LABEL_KEEP, LABEL_OWNER
from exitwatch.kinds.base import Change, Found, Gone, Resource, Snapshot
from exitwatch.kinds.docker.kind import Containers
from exitwatch.owner import Owner

from support.engine import PrivateEngine
from support.procs import kill, killed_owner, spawn_owner, wait_for

COMPOSE_YML = """\
version: "2.4"
services:
  main:
    image: exitwatch-test/busybox:latest
    labels:
      exitwatch.owner: ${EXITWATCH_OWNER}
    volumes: ["/scratch"]
    networks: [inner]
  helper:
    image: exitwatch-test/busybox:latest
    networks: [inner]
  peer:
    image: exitwatch-test/busybox:latest
    labels:
      exitwatch.owner: ${PEER_OWNER}
    networks: [inner]
networks:
  inner: {}
"""


def run(engine: PrivateEngine, *args: str, labels: dict[str, str] | None = None) -> str:
    """`docker run -d` against the private engine; the new container's id."""
    flags = [f"--label={k}={v}" for k, v in (labels or {}).items()]
    return engine.docker("run", "-d", *flags, *args, engine.image).stdout.strip()


def exists(engine: PrivateEngine, cid: str) -> bool:
    try:
        engine.client.api.inspect_container(cid)
    except docker.errors.NotFound:
        return False
    return True


def held_by(kind: Containers, owner: Owner) -> list[Resource]:
    return [r for r in kind.scan().resources if r.owner == owner]


def next_change(changes: queue.Queue[Change], match: Callable[[Change], bool]) -> Change:
    """The next change that `match` accepts, skipping others (replays of earlier tests)."""

    def get() -> Change | None:
        try:
            change = changes.get(timeout=0.1)
        except queue.Empty:
            return None
        return change if match(change) else None

    return wait_for(get, what="a matching change from the docker kind")


def is_snapshot(change: Change) -> bool:
    return isinstance(change, Snapshot)


def own(key: str) -> str:
    """A resource key of the kind as its engine knows it: without the engine's scope
    (kinds/docker/kind.py)."""
    return key.rpartition("|")[2]


def found(cid: str) -> Callable[[Change], bool]:
    return lambda c: isinstance(c, Found) and own(c.resource.key) == cid


def gone(cid: str) -> Callable[[Change], bool]:
    return lambda c: isinstance(c, Gone) and own(c.key) == cid


# -- scan ---------------------------------------------------------------------------------------


def test_scan_lists_labelled_containers_running_and_created(
    engine: PrivateEngine, kind: Containers, caplog: pytest.LogCaptureFixture
) -> None:
    owner = killed_owner()
    running = run(engine, "--name=ew-running", labels={LABEL_OWNER: str(owner)})
    created = engine.docker(
        "create", f"--label={LABEL_OWNER}={owner}", "--name=ew-created", engine.image
    ).stdout.strip()
    run(engine, "--name=ew-kept", labels={LABEL_OWNER: str(owner), LABEL_KEEP: "true"})
    run(engine, "--name=ew-unlabelled")
    bad = run(engine, "--name=ew-bad", labels={LABEL_OWNER: "not-an-owner"})

    with caplog.at_level(logging.WARNING, logger="exitwatch"):
        snap = kind.scan()

    assert snap.kind == "container"
    assert {own(r.key): replace(r, key=own(r.key)) for r in snap.resources} == {
        running: Resource("container", running, owner, "ew-running", None),
        created: Resource("container", created, owner, "ew-created", None),
    }
    [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
    message = warning.getMessage()
    assert "ew-bad" in message and bad[:12] in message and "not-an-owner" in message
    assert "\n" not in message and warning.exc_info is None


def test_scan_names_the_compose_project_as_group(engine: PrivateEngine, kind: Containers) -> None:
    owner = killed_owner()
    cid = run(engine, labels={LABEL_OWNER: str(owner), LABEL_COMPOSE_PROJECT: "ewproj"})
    [r] = kind.scan().resources
    assert (own(r.key), r.group) == (cid, "ewproj")


def test_ping_answers_none_when_the_engine_answers(engine: PrivateEngine, kind: Containers) -> None:
    assert kind.ping() is None


# -- start: snapshot, then changes --------------------------------------------------------------


def test_start_sends_a_snapshot_then_found_and_gone(
    engine: PrivateEngine, kind: Containers
) -> None:
    owner = killed_owner()
    before = run(engine, labels={LABEL_OWNER: str(owner)})
    changes: queue.Queue[Change] = queue.Queue()
    kind.start(changes.put)

    first = next_change(changes, lambda c: True)
    assert isinstance(first, Snapshot)
    assert [own(r.key) for r in first.resources] == [before]
    wait_for(lambda: kind.health()["connected"], what="the kind to follow the events stream")

    # Events arrive in order: had the kept or the malformed container been reported, that
    # would come before the Found of the one created after them.
    kept = run(engine, labels={LABEL_OWNER: str(owner), LABEL_KEEP: "true"})
    bad = run(engine, labels={LABEL_OWNER: "not-an-owner"})
    later = run(engine, "--name=ew-later", labels={LABEL_OWNER: str(owner)})
    seen: list[Change] = []
    next_change(changes, lambda c: seen.append(c) or found(later)(c))
    scope = f"{engine.socket}|"
    assert seen[-1] == Found(Resource("container", scope + later, owner, "ew-later", None))
    assert not [c for c in seen if isinstance(c, Found) and own(c.resource.key) in (kept, bad)]

    engine.docker("rm", "-f", later)
    next_change(changes, gone(later))

    kind.stop()
    assert "exitwatch-docker-events" not in {t.name for t in threading.enumerate()}


def test_engine_restart_reconnects_and_sends_a_fresh_snapshot(
    engine: PrivateEngine, kind: Containers
) -> None:
    owner = killed_owner()
    cid = run(engine, labels={LABEL_OWNER: str(owner)})
    changes: queue.Queue[Change] = queue.Queue()
    kind.start(changes.put)
    next_change(changes, is_snapshot)
    wait_for(lambda: kind.health()["connected"], what="the kind to follow the events stream")
    assert kind.health()["reconnects"] == 0

    try:
        engine.stop()
        wait_for(
            lambda: not kind.health()["connected"], what="the kind to notice the engine is gone"
        )
        assert kind.health()["last_error"]
    finally:
        engine.start()

    snap = next_change(changes, is_snapshot)
    assert cid in {own(r.key) for r in snap.resources}
    health = kind.health
    wait_for(lambda: health()["connected"] and health()["reconnects"] == 1, what="a reconnect")
    # And it follows events again.
    later = run(engine, labels={LABEL_OWNER: str(owner)})
    next_change(changes, found(later))


# -- remove -------------------------------------------------------------------------------------


def test_remove_takes_a_running_container_and_its_anonymous_volume(
    engine: PrivateEngine, kind: Containers
) -> None:
    owner = killed_owner()
    cid = run(engine, "--volume=/scratch", labels={LABEL_OWNER: str(owner)})
    [mount] = engine.client.api.inspect_container(cid)["Mounts"]
    held = held_by(kind, owner)

    [outcome] = kind.reap(owner, held, dry_run=False)
    assert (outcome.ok, outcome.detail, outcome.kind) == (True, "removed", "container")
    assert cid[:12] in outcome.what
    assert not exists(engine, cid)
    assert mount["Name"] not in {v["Name"] for v in engine.client.api.volumes()["Volumes"] or []}

    # Removing it again is no failure: it is already gone.
    [again] = kind.reap(owner, held, dry_run=False)
    assert (again.ok, again.detail) == (True, "already gone")


def test_remove_refuses_a_live_owner(
    engine: PrivateEngine, kind: Containers, live_owner: Owner
) -> None:
    cid = run(engine, labels={LABEL_OWNER: str(live_owner)})
    [outcome] = kind.reap(live_owner, held_by(kind, live_owner), dry_run=False)
    assert outcome.refused and not outcome.ok
    assert exists(engine, cid)


def test_dry_run_removes_nothing(engine: PrivateEngine, kind: Containers) -> None:
    owner = killed_owner()
    cid = run(engine, labels={LABEL_OWNER: str(owner)})
    [outcome] = kind.reap(owner, held_by(kind, owner), dry_run=True)
    assert outcome.ok and "dry run" in outcome.detail
    assert exists(engine, cid)


# -- remove: compose projects -------------------------------------------------------------------


@pytest.fixture
def compose_up(engine: PrivateEngine, tmp_path: Path) -> Callable[[Owner, str], str]:
    """Bring up the project in COMPOSE_YML for `main`'s owner and `peer`'s label; its name."""
    (tmp_path / "docker-compose.yml").write_text(COMPOSE_YML)

    def up(owner: Owner, peer: str) -> str:
        project = f"ew{uuid.uuid4().hex[:10]}"
        env = {"EXITWATCH_OWNER": str(owner), "PEER_OWNER": peer}
        engine.compose("-p", project, "up", "-d", cwd=tmp_path, env=env)
        return project

    return up


def project_containers(engine: PrivateEngine, project: str) -> dict[str, str]:
    """Service name (or, outside compose, the id) -> id, of the project's containers now."""
    listed = engine.client.api.containers(
        all=True, filters={"label": f"{LABEL_COMPOSE_PROJECT}={project}"}
    )
    return {c["Labels"].get("com.docker.compose.service", c["Id"]): c["Id"] for c in listed}


def project_networks(engine: PrivateEngine, project: str) -> list[str]:
    nets = engine.client.api.networks(filters={"label": f"{LABEL_COMPOSE_PROJECT}={project}"})
    return [n["Name"] for n in nets]


def test_a_dead_owners_compose_project_goes_as_a_whole(
    engine: PrivateEngine, kind: Containers, compose_up: Callable[[Owner, str], str]
) -> None:
    owner, other_dead = killed_owner(), killed_owner()
    project = compose_up(owner, str(other_dead))
    held = held_by(kind, owner)
    assert [r.group for r in held] == [project]

    outcomes = kind.reap(owner, held, dry_run=False)

    assert all(o.ok for o in outcomes), outcomes
    assert sorted(o.kind for o in outcomes) == ["container"] * 3 + ["network"]
    assert project_containers(engine, project) == {}
    assert project_networks(engine, project) == []


def test_a_live_sibling_keeps_the_project_but_not_the_dead_owners_containers(
    engine: PrivateEngine,
    kind: Containers,
    compose_up: Callable[[Owner, str], str],
    live_owner: Owner,
) -> None:
    owner = killed_owner()
    project = compose_up(owner, str(live_owner))
    before = project_containers(engine, project)

    outcomes = kind.reap(owner, held_by(kind, owner), dry_run=False)

    assert project_containers(engine, project) == {
        "helper": before["helper"],
        "peer": before["peer"],
    }
    assert project_networks(engine, project) == [f"{project}_inner"]
    [removed] = [o for o in outcomes if o.kind == "container"]
    assert removed.ok and before["main"][:12] in removed.what
    [kept] = [o for o in outcomes if o.kind == "project"]
    assert kept.refused and str(live_owner) in kept.detail


def test_a_malformed_sibling_label_keeps_the_project(
    engine: PrivateEngine,
    kind: Containers,
    compose_up: Callable[[Owner, str], str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    owner = killed_owner()
    project = compose_up(owner, "not-an-owner")
    before = project_containers(engine, project)

    with caplog.at_level(logging.WARNING, logger="exitwatch"):
        outcomes = kind.reap(owner, held_by(kind, owner), dry_run=False)

    assert set(project_containers(engine, project)) == {"helper", "peer"}
    assert project_networks(engine, project) == [f"{project}_inner"]
    assert [o.refused for o in outcomes if o.kind == "project"] == [True]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(before["peer"][:12] in w and project in w for w in warnings), warnings


def test_a_kept_container_stays_and_so_do_the_networks_it_uses(
    engine: PrivateEngine, kind: Containers, compose_up: Callable[[Owner, str], str]
) -> None:
    owner = killed_owner()
    project = compose_up(owner, str(killed_owner()))
    kept = run(
        engine,
        f"--network={project}_inner",
        labels={LABEL_COMPOSE_PROJECT: project, LABEL_KEEP: "true"},
    )

    outcomes = kind.reap(owner, held_by(kind, owner), dry_run=False)

    assert list(project_containers(engine, project).values()) == [kept]
    assert project_networks(engine, project) == [f"{project}_inner"]
    assert all(o.ok for o in outcomes if o.kind == "container")
    [net] = [o for o in outcomes if o.kind == "network"]
    assert net.refused and not net.ok


def test_a_kept_network_of_the_project_stays(
    engine: PrivateEngine, kind: Containers, compose_up: Callable[[Owner, str], str]
) -> None:
    owner = killed_owner()
    project = compose_up(owner, str(killed_owner()))
    labels = {LABEL_COMPOSE_PROJECT: project, LABEL_KEEP: "true"}
    engine.client.api.create_network(f"{project}_kept", labels=labels)

    outcomes = kind.reap(owner, held_by(kind, owner), dry_run=False)

    assert project_containers(engine, project) == {}
    assert project_networks(engine, project) == [f"{project}_kept"]
    assert [o.what for o in outcomes if o.kind == "network"] == [f"network {project}_inner"]


def racing_remove_network(
    engine: PrivateEngine, kind: Containers, times: int
) -> tuple[list[str], list[str]]:
    """Make the first `times` network removals meet a running container on the network, as
    when the engine has not yet let go of the endpoints of containers just removed: the
    engine answers 403. The container goes after each refusal. (calls, containers started)"""
    [(follower, _)] = kind.followers()
    real, calls, strangers = follower._engine.remove_network, [], []

    def remove(nid: str) -> None:
        calls.append(nid)
        if len(calls) > times:
            return real(nid)
        strangers.append(run(engine, f"--network={nid}"))
        try:
            real(nid)
        finally:
            engine.client.api.remove_container(strangers[-1], force=True)

    follower._engine.remove_network = remove
    return calls, strangers


def test_a_network_refused_for_active_endpoints_is_tried_again(
    engine: PrivateEngine, kind: Containers, compose_up: Callable[[Owner, str], str]
) -> None:
    owner = killed_owner()
    project = compose_up(owner, str(killed_owner()))
    calls, strangers = racing_remove_network(engine, kind, times=1)

    outcomes = kind.reap(owner, held_by(kind, owner), dry_run=False)

    [net] = [o for o in outcomes if o.kind == "network"]
    assert (net.ok, net.detail, len(calls), len(strangers)) == (True, "removed", 2, 1)
    assert project_networks(engine, project) == []


def test_a_retry_of_the_job_finds_the_network_its_containers_left(
    engine: PrivateEngine, kind: Containers, compose_up: Callable[[Owner, str], str]
) -> None:
    owner = killed_owner()
    project = compose_up(owner, str(killed_owner()))
    held = held_by(kind, owner)
    calls, _ = racing_remove_network(engine, kind, times=3)

    first = kind.reap(owner, held, dry_run=False)

    [net] = [o for o in first if o.kind == "network"]
    assert not net.ok and not net.refused and "403" in net.detail, net
    assert project_containers(engine, project) == {} and len(calls) == 3
    # The agent retries the job with the same resources, every container of it gone now.
    again = kind.reap(owner, held, dry_run=False)
    [net] = [o for o in again if o.kind == "network"]
    assert (net.ok, net.detail) == (True, "removed")
    assert project_networks(engine, project) == []


def test_dry_run_leaves_a_compose_project_whole(
    engine: PrivateEngine, kind: Containers, compose_up: Callable[[Owner, str], str]
) -> None:
    owner = killed_owner()
    project = compose_up(owner, str(killed_owner()))
    before = project_containers(engine, project)

    outcomes = kind.reap(owner, held_by(kind, owner), dry_run=True)

    assert sorted(o.kind for o in outcomes) == ["container"] * 3 + ["network"]
    assert all(o.ok and "dry run" in o.detail for o in outcomes)
    assert project_containers(engine, project) == before
    assert project_networks(engine, project) == [f"{project}_inner"]


# A project name is no identity: compose defaults it to the directory's basename.
PROD_YML = """\
version: "2.4"
services:
  db:
    image: exitwatch-test/busybox:latest
    volumes: ["/data"]
"""
EVAL_YML = """\
version: "2.4"
services:
  main:
    image: exitwatch-test/busybox:latest
    labels:
      exitwatch.owner: ${EXITWATCH_OWNER}
  helper:
    image: exitwatch-test/busybox:latest
"""


def _compose_dir(path: Path, yml: str) -> Path:
    path.mkdir()
    (path / "docker-compose.yml").write_text(yml)
    return path


def test_a_project_of_the_same_name_elsewhere_is_refused_not_removed(
    engine: PrivateEngine, kind: Containers, tmp_path: Path
) -> None:
    project = f"ew{uuid.uuid4().hex[:10]}"
    # A long-running, unlabelled production project, up before the eval's owner started.
    prod = _compose_dir(tmp_path / "prod", PROD_YML)
    engine.compose("-p", project, "up", "-d", cwd=prod)
    prod_db = project_containers(engine, project)["db"]
    child = spawn_owner()
    evaluation = _compose_dir(tmp_path / "eval", EVAL_YML)
    engine.compose(
        "-p", project, "up", "-d", cwd=evaluation, env={"EXITWATCH_OWNER": str(child.owner)}
    )
    ours = project_containers(engine, project)
    # As the engine names them: compose v1 says <project>_main_1, v2 <project>-main-1.
    names = {
        service: engine.client.api.inspect_container(cid)["Name"].lstrip("/")
        for service, cid in ours.items()
    }
    kill(child)

    outcomes = kind.reap(child.owner, held_by(kind, child.owner), dry_run=False)

    assert project_containers(engine, project) == {"db": prod_db}
    assert project_networks(engine, project) == [f"{project}_default"]
    by_what = {o.what: o for o in outcomes}
    assert by_what[f"container {ours['main'][:12]} ({names['main']})"].ok
    assert by_what[f"container {ours['helper'][:12]} ({names['helper']})"].ok
    refused = by_what[f"container {prod_db[:12]} ({names['db']})"]
    assert refused.refused and not refused.ok
    assert f"working directory and config files ({prod})" in refused.detail
    [whole] = [o for o in outcomes if o.kind == "project"]
    assert whole.refused and prod_db[:12] in whole.detail


def test_an_unlabelled_sibling_older_than_the_owner_is_refused(
    engine: PrivateEngine, kind: Containers, tmp_path: Path
) -> None:
    project = f"ew{uuid.uuid4().hex[:10]}"
    here = _compose_dir(tmp_path / "app", EVAL_YML)
    # Same directory, same files: only the order of the starts tells them apart.
    engine.compose("-p", project, "up", "-d", "helper", cwd=here, env={"EXITWATCH_OWNER": ""})
    older = project_containers(engine, project)["helper"]
    child = spawn_owner()
    engine.compose(
        "-p", project, "up", "-d", "main", cwd=here, env={"EXITWATCH_OWNER": str(child.owner)}
    )
    main = project_containers(engine, project)["main"]
    kill(child)

    outcomes = kind.reap(child.owner, held_by(kind, child.owner), dry_run=False)

    assert project_containers(engine, project) == {"helper": older}
    assert project_networks(engine, project) == [f"{project}_default"]
    [removed] = [o for o in outcomes if o.ok]
    assert main[:12] in removed.what
    refused = [o for o in outcomes if o.refused]
    # Running, it is told older by its process's start in ticks since boot, before any
    # clock is read (a stopped one by its creation time: engine/test_clock_steps.py).
    assert any(
        older[:12] in o.what and "its main process started before its owner did" in o.detail
        for o in refused
    ), refused


def test_a_project_network_made_before_its_owner_started_stays(
    engine: PrivateEngine, kind: Containers, tmp_path: Path
) -> None:
    project = f"ew{uuid.uuid4().hex[:10]}"
    here = _compose_dir(tmp_path / "app", EVAL_YML)
    # An earlier `up` of the same project made its network; its container went, the
    # network stayed, and the owner's `up` joins it.
    engine.compose("-p", project, "up", "-d", "helper", cwd=here, env={"EXITWATCH_OWNER": ""})
    engine.compose("-p", project, "rm", "-sf", "helper", cwd=here, env={"EXITWATCH_OWNER": ""})
    assert project_containers(engine, project) == {}
    child = spawn_owner()
    engine.compose("-p", project, "up", "-d", cwd=here, env={"EXITWATCH_OWNER": str(child.owner)})
    assert set(project_containers(engine, project)) == {"main", "helper"}
    kill(child)

    outcomes = kind.reap(child.owner, held_by(kind, child.owner), dry_run=False)

    assert project_containers(engine, project) == {}  # the project went as a whole
    assert project_networks(engine, project) == [f"{project}_default"]
    [network] = [o for o in outcomes if o.kind == "network"]
    assert network.refused and "it was created before its owner started" in network.detail


def test_an_unlabelled_sibling_of_other_config_files_in_the_same_directory_stays(
    engine: PrivateEngine, kind: Containers, tmp_path: Path
) -> None:
    project = f"ew{uuid.uuid4().hex[:10]}"
    here = _compose_dir(tmp_path / "app", EVAL_YML)
    (here / "prod.yml").write_text(PROD_YML)
    child = spawn_owner()
    # Up after the owner started, from the same directory: only its config files tell it
    # apart from the owner's instance.
    engine.compose("-p", project, "-f", "prod.yml", "up", "-d", cwd=here)
    prod_db = project_containers(engine, project)["db"]
    engine.compose("-p", project, "up", "-d", cwd=here, env={"EXITWATCH_OWNER": str(child.owner)})
    ours = project_containers(engine, project)
    kill(child)

    outcomes = kind.reap(child.owner, held_by(kind, child.owner), dry_run=False)

    assert project_containers(engine, project) == {"db": prod_db}
    by_id = {o.extra.get("id"): o for o in outcomes if o.kind == "container"}
    assert by_id[ours["main"]].ok and by_id[ours["helper"]].ok
    refused = by_id[prod_db]
    assert refused.refused
    assert f"working directory and config files ({here}) are not its owner's" in refused.detail
    [whole] = [o for o in outcomes if o.kind == "project"]
    assert whole.refused and prod_db[:12] in whole.detail
