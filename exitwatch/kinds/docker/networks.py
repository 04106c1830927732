"""The networks and volumes an ended run leaves: those of a compose project removed as a
whole, and those labelled with its owner. Each goes only once no container uses it."""

from __future__ import annotations

import functools
from collections.abc import Callable

from exitwatch.contract import LABEL_COMPOSE_PROJECT, LABEL_OWNER, kept
from exitwatch.kinds.base import Outcome
from exitwatch.kinds.docker import compose
from exitwatch.kinds.docker.engine import ENGINE_ERRORS, Engine, attempt, engine_error, name_of
from exitwatch.owner import Owner


def of_project(engine: Engine, project: str, since: float | None, dry_run: bool) -> list[Outcome]:
    """Remove the networks of a project whose containers were just removed, unless some
    container is left (a kept one, one that would not go, or one created meanwhile), or
    the network is older than the owner (compose.py), or is labelled exitwatch.keep=true."""
    label = f"{LABEL_COMPOSE_PROJECT}={project}"
    try:
        nets = engine.networks(label)
        listed = [] if dry_run else engine.containers(label)
    except ENGINE_ERRORS as err:
        why = f"listing compose project {project}: {engine_error(err)}"
        return [Outcome(f"networks of compose project {project}", "network", False, why)]
    left = ", ".join(name_of(c) for c in listed)
    outcomes = []
    for net in nets:
        if kept(net.get("Labels") or {}):
            continue
        extra = {"id": net["Id"], "project": project}
        said = functools.partial(Outcome, f"network {net.get('Name', '')}", "network", extra=extra)
        why = compose.why_older(net.get("Created"), since)
        if why is not None:
            outcomes.append(said(False, f"not removed with compose project {project}: {why}", True))
        elif dry_run:
            outcomes.append(said(True, "dry run: would remove"))
        elif left:
            outcomes.append(said(False, f"containers remain in the project: {left}", True))
        else:
            outcomes.append(
                said(*_remove_unused(engine, "network", net["Id"], engine.remove_network))
            )
    return outcomes


def labelled(
    engine: Engine, owner: Owner, dry_run: bool, done: list[Outcome], held: set[str]
) -> list[Outcome]:
    """Remove the networks and volumes labelled with `owner` (a compose project's named
    volumes and networks, or ones made by hand), once none of its containers is left and
    no container at all uses them. Those already dealt with in `done` are skipped, and
    those of a compose project in `held` (one not removed as a whole) stay with it."""
    label = f"{LABEL_OWNER}={owner}"
    seen = {o.extra.get("id") for o in done}
    try:
        nets = [n for n in engine.networks(label) if n["Id"] not in seen]
        vols = engine.volumes(label)
        left = [] if dry_run or not (nets or vols) else engine.containers(label)
    except ENGINE_ERRORS as err:
        why = f"listing what owner {owner} labelled: {engine_error(err)}"
        return [Outcome(f"networks and volumes of {owner}", "network", False, why)]
    outcomes = []
    for kind, items, key, call in (
        ("network", nets, "Id", engine.remove_network),
        ("volume", vols, "Name", engine.remove_volume),
    ):
        for item in items:
            labels = item.get("Labels") or {}
            if kept(labels):
                continue
            said = functools.partial(
                Outcome, f"{kind} {item.get('Name', '')}", kind, extra={"id": item[key]}
            )
            project = labels.get(LABEL_COMPOSE_PROJECT)
            if project in held:
                why = f"compose project {project} was not removed as a whole"
                outcomes.append(said(False, why, True))
            elif dry_run:
                outcomes.append(said(True, "dry run: would remove"))
            elif left:
                names = ", ".join(name_of(c) for c in left)
                outcomes.append(said(False, f"containers of the owner remain: {names}", True))
            else:
                outcomes.append(said(*_remove_unused(engine, kind, item[key], call)))
    return outcomes


def _remove_unused(engine: Engine, kind: str, ident: str, call: Callable[[str], None]) -> tuple:
    """Remove a network or volume unless a container, of any owner or none, uses it:
    removing it would cut a stopped container off, and a running one makes the engine
    refuse. Such a one is left (a refusal), for whoever owns that container."""
    try:
        users = engine.users(kind, ident)
    except ENGINE_ERRORS as err:
        return False, f"listing the containers that use it: {engine_error(err)}"
    if users:
        return False, f"in use by containers: {', '.join(name_of(c) for c in users)}", True
    # 403 "active endpoints" is a known race: the engine lets go of a network a moment
    # after the containers that used it are gone.
    return attempt(functools.partial(call, ident), (409, 403) if kind == "network" else (409,))
