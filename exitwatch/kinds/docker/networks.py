"""The networks and volumes an ended run leaves: those of a compose project removed as a
whole, and those labelled with its owner. Each goes only once no container uses it; one
still in use fails its attempt, to be tried again later (a retry, the next reconcile)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from exitwatch.contract import LABEL_OWNER, kept
from exitwatch.engine.api import Engine
from exitwatch.engine.client import ENGINE_ERRORS
from exitwatch.engine.errors import describe
from exitwatch.kinds.base import Outcome
from exitwatch.kinds.docker import compose
from exitwatch.kinds.docker.attempts import attempt, name_of
from exitwatch.kinds.docker.labels import NETWORK, VOLUME, key_of
from exitwatch.kinds.docker.projects import members
from exitwatch.owner import Owner, OwnerError, death


def of_project(
    engine: Engine,
    owner: Owner,
    project: str,
    since: float | str,
    dry_run: bool,
    keys: set[str],
) -> list[Outcome]:
    """Remove the networks of a project whose containers were just removed, unless some
    container is left (a kept one, one that would not go, or one created meanwhile), or
    the network is older than the owner (compose.py), is labelled exitwatch.keep=true, or
    with another owner who lives. `keys`: the Resource keys of the job, which its
    outcomes name."""
    try:
        nets = members(engine.networks, project)
        listed = [] if dry_run else members(engine.containers, project)
    except ENGINE_ERRORS as err:
        why = f"listing compose project {project}: {describe(err)}"
        return [Outcome.failed(f"networks of compose project {project}", "network", why)]
    left = ", ".join(name_of(c) for c in listed)
    outcomes = []
    for net in nets:
        if kept(net.get("Labels") or {}):
            continue
        about = {
            "what": f"network {net.get('Name', '')}",
            "kind": "network",
            "extra": {"id": net["Id"], "project": project},
        }
        if key_of(NETWORK, net["Id"]) in keys:
            about["key"] = key_of(NETWORK, net["Id"])
        why = compose.why_older(net.get("Created"), since) or _held_by_live(net, owner)
        if why is not None:
            why = f"not removed with compose project {project}: {why}"
        remain = f"containers remain in the project: {left}" if left else ""
        outcomes.append(_one(engine, net["Id"], engine.remove_network, about, why, dry_run, remain))
    return outcomes


def _held_by_live(item: dict[str, Any], owner: Owner) -> str | None:
    """Why a network of a project is another owner's who lives, or None."""
    try:
        other = Owner.parse((item.get("Labels") or {}).get(LABEL_OWNER, ""))
    except OwnerError:
        return None  # unlabelled (or unreadable): the project's, as compose made it
    if other == owner or death(other) is not None:
        return None
    return f"it is labelled with live owner {other}"


def labelled(
    engine: Engine,
    owner: Owner,
    dry_run: bool,
    done: list[Outcome],
    held: set[str],
    keys: set[str],
) -> list[Outcome]:
    """Remove the networks and volumes labelled with `owner` (a compose project's named
    volumes and networks, or ones made by hand), once none of its containers is left and
    no container at all uses them. Those already dealt with in `done` are skipped, and
    those of a compose project in `held` (one not removed as a whole) stay with it.
    `keys`: the Resource keys of the job, which its outcomes name."""
    label = f"{LABEL_OWNER}={owner}"
    seen = {o.extra.get("id") for o in done}
    try:
        nets = [n for n in engine.networks(label) if n["Id"] not in seen]
        vols = engine.volumes(label)
        left = [] if dry_run or not (nets or vols) else engine.containers(label)
    except ENGINE_ERRORS as err:
        why = f"listing what owner {owner} labelled: {describe(err)}"
        return [Outcome.failed(f"networks and volumes of {owner}", "network", why)]
    outcomes = []
    for kind, items, key, call in (
        (NETWORK, nets, "Id", engine.remove_network),
        (VOLUME, vols, "Name", engine.remove_volume),
    ):
        for item in items:
            labels = item.get("Labels") or {}
            if kept(labels):
                continue
            about = {
                "what": f"{kind} {item.get('Name', '')}",
                "kind": kind,
                "extra": {"id": item[key]},
            }
            if key_of(kind, item[key]) in keys:
                about["key"] = key_of(kind, item[key])
            project = compose.project_of(labels)
            why = None
            if project in held:
                why = f"compose project {project} was not removed as a whole"
            names = ", ".join(map(name_of, left))
            remain = f"containers of the owner remain: {names}" if left else ""
            outcomes.append(_one(engine, item[key], call, about, why, dry_run, remain))
    return outcomes


def _one(
    engine: Engine,
    ident: str,
    call: Callable[[str], None],
    about: dict[str, Any],
    why_not: str | None,
    dry_run: bool,
    remain: str,
) -> Outcome:
    """One network or volume: left alone `why_not`, or while the containers of `remain`
    are; else removed unless a container uses it."""
    if why_not is not None:
        return Outcome.refusal(why=why_not, **about)
    if dry_run:
        return Outcome.done(detail="dry run: would remove", **about)
    if remain:
        return Outcome.refusal(why=remain, **about)
    return _remove_unused(engine, ident, call, about)


def _remove_unused(
    engine: Engine, ident: str, call: Callable[[str], None], about: dict[str, Any]
) -> Outcome:
    """Remove a network or volume (`about` says which, for its Outcome) unless a container,
    of any owner or none, uses it: removing it would cut a stopped container off, and a
    running one makes the engine refuse. Such a one is left, and the attempt fails, so
    that it is tried again later (the agent's retries, then every reconcile): the
    container may go first."""
    kind = about["kind"]
    try:
        users = engine.users(kind, ident)
    except ENGINE_ERRORS as err:
        why = f"listing the containers that use it: {describe(err)}"
        return Outcome.failed(detail=why, **about)
    if users:
        why = f"in use by containers: {', '.join(name_of(c) for c in users)}"
        return Outcome.failed(detail=why, **about)
    # 403 "active endpoints" is a known race: the engine lets go of a network a moment
    # after the containers that used it are gone.
    again = (409, 403) if kind == "network" else (409,)
    ok, detail = attempt(functools.partial(call, ident), again)
    return Outcome(ok=ok, detail=detail, **about)
