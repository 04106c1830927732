"""A dead owner's compose projects as the engine lists them now: which containers go, and
whether a project goes as a whole (with its networks), by the rules of compose.py. The
container kind's removal asks; this module lists, inspects and judges, and removes
nothing."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from exitwatch.contract import LABEL_OWNER, kept
from exitwatch.engine.api import Engine
from exitwatch.engine.client import ENGINE_ERRORS
from exitwatch.engine.errors import describe
from exitwatch.kinds.base import Outcome, Resource
from exitwatch.kinds.docker import compose
from exitwatch.kinds.docker.attempts import name_of
from exitwatch.kinds.docker.labels import carries, owner_from
from exitwatch.owner import Owner, death

KIND = "container"


def container(cid: str, name: str, project: str | None) -> dict[str, Any]:
    """What an Outcome says of one container: the words for people, and the audit's ids."""
    extra = {"id": cid, "project": project}
    return {"what": f"container {cid[:12]} ({name})", "kind": KIND, "extra": extra}


def members(listing: Callable[[str], list[dict[str, Any]]], project: str) -> list[dict[str, Any]]:
    """What `listing` (the engine's containers or networks) gives of `project` under either
    of its labels (compose.PROJECT_LABELS), once each, and only what its labels name as of
    it: one whose labels name two projects is of the first's."""
    found: dict[str, dict[str, Any]] = {}
    for key in compose.PROJECT_LABELS:
        for item in listing(f"{key}={project}"):
            if compose.project_of(item.get("Labels") or {}) == project:
                found.setdefault(item["Id"], item)
    return list(found.values())


def plan(
    engine: Engine, owner: Owner, project: str, given: list[Resource], since: float | str
) -> tuple[dict[str, str], bool, list[Outcome]]:
    """Which containers of `project` go ({id: name}), whether it goes as a whole, and what
    to report. From a fresh listing of the whole project: a runner may have recreated a
    container without its labels, or a live runner may have joined the project. `given`:
    the owner's containers of it that the index held; `since`: compose.started_at."""
    try:
        listed = members(engine.containers, project)
    except ENGINE_ERRORS as err:
        why = f"listing compose project {project}: {describe(err)}"
        failed = [Outcome.failed(detail=why, **container(r.key, r.name, project)) for r in given]
        return {}, False, failed or [Outcome.failed(f"compose project {project}", "project", why)]
    why_dead = functools.cache(death)
    holders: list[str] = []  # why the project cannot go as a whole
    dead_held = False
    own: dict[str, str] = {}
    rest: dict[str, str] = {}
    for c in listed:
        cid, name, labels = c["Id"], name_of(c), c.get("Labels") or {}
        o = None
        if LABEL_OWNER in labels:
            o = owner_from(cid, name, labels, f"compose project {project} is not proven dead")
            if o is None:
                holders.append(f"{name} has an unreadable owner label")
        if o is not None and o != owner and why_dead(o) is None:
            holders.append(f"{name} is held by live owner {o}")
        elif o is not None:
            dead_held = True
        if not kept(labels):
            (own if o == owner else rest)[cid] = name
    said = [
        Outcome.done(detail="already gone", **container(r.key, r.name, project))
        for r in given
        if r.key not in own
    ]
    if not listed:
        # Nothing is left to hold it: a retry after its networks failed to go finds them,
        # and so does the death of an owner whose containers went before it (`compose
        # down` without -v).
        return {}, True, said
    if holders:
        why = "not removed as a whole: " + "; ".join(holders)
        said.append(Outcome.refusal(f"compose project {project}", "project", why))
    # A project goes as a whole when a dead owner holds some of it and no live one any.
    if holders or not dead_held:
        return own, False, said
    joined, refused = _unlabelled(engine, owner, project, listed, rest, since)
    if refused:
        names = ", ".join(o.what for o in refused)
        why = f"not removed as a whole, networks included: {names} stay"
        refused.append(Outcome.refusal(f"compose project {project}", "project", why))
    return own | joined, not refused, said + refused


def _unlabelled(
    engine: Engine,
    owner: Owner,
    project: str,
    listed: list[dict[str, Any]],
    rest: dict[str, str],
    since: float | str,
) -> tuple[dict[str, str], list[Outcome]]:
    """Which of `rest` go with the owner's project ({id: name}), and a refusal for each
    unlabelled one not proven to be of the owner's instance of it (compose.py)."""
    owned = [compose.instance(c.get("Labels") or {}) for c in listed if carries(c, owner)]
    joined, refused = {}, []
    for c in listed:
        cid, labels = c["Id"], c.get("Labels") or {}
        if cid not in rest:
            continue
        why = None
        if LABEL_OWNER not in labels:  # labelled ones are their own owners' business
            why = compose.why_not_ours(labels, owned)
            if why is None:
                try:
                    info = engine.inspect(cid)
                except ENGINE_ERRORS as err:
                    why = f"its creation time cannot be read: {describe(err)}"
                else:
                    why = compose.why_started_before(info.get("State"), owner)
                    why = why or compose.why_older(info.get("Created"), since)
        if why is None:
            joined[cid] = rest[cid]
        else:
            what = f"not removed with compose project {project}: {why}"
            refused.append(Outcome.refusal(why=what, **container(cid, rest[cid], project)))
    return joined, refused
