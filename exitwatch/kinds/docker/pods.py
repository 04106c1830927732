"""Podman's pods labelled with an ended owner: each removed with its containers before the
owner's containers are, since podman removes a pod's infra container only with its pod (it
refuses a removal of that container alone). A pod carries its owner as a container does:
`podman pod create` is labelled by the proxies, and its infra container takes the pod's
labels, which is how the index hears of it. A pod that holds a container of a live owner,
or one labelled exitwatch.keep=true, stays whole, as a compose project does (compose.py),
with its infra container. Another engine has no pods: nothing to do."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from exitwatch.contract import LABEL_OWNER, kept
from exitwatch.engine.api import Engine
from exitwatch.engine.client import ENGINE_ERRORS
from exitwatch.engine.errors import NotFound, describe
from exitwatch.kinds.base import Outcome
from exitwatch.kinds.docker.attempts import attempt
from exitwatch.owner import Owner, OwnerError, death

POD = "pod"


@dataclass
class Removed:
    """What became of an owner's pods; `spared`: the infra container of each pod left in
    place, which podman would refuse to remove alone, with why."""

    outcomes: list[Outcome] = field(default_factory=list)
    spared: dict[str, str] = field(default_factory=dict)


def labelled(engine: Engine, owner: Owner, dry_run: bool) -> Removed:
    """Remove the pods labelled with `owner` (not those labelled exitwatch.keep=true), each
    with its containers, unless it holds what must stay."""
    done = Removed()
    try:
        pods = engine.pods(f"{LABEL_OWNER}={owner}")
    except ENGINE_ERRORS as err:
        why = f"listing the pods of {owner}: {describe(err)}"
        done.outcomes.append(Outcome.failed(f"pods of {owner}", POD, why))
        return done
    for pod in pods:
        if kept(pod.get("Labels") or {}):
            continue
        about = {"what": f"pod {pod.get('Name', '')}", "kind": POD, "extra": {"id": pod["Id"]}}
        try:
            why = _holds(engine, pod, owner)
        except ENGINE_ERRORS as err:
            done.outcomes.append(Outcome.failed(detail=f"its containers: {describe(err)}", **about))
            continue
        if why is not None:
            done.outcomes.append(Outcome.refusal(why=why, **about))
            if isinstance(pod.get("InfraId"), str):
                done.spared[pod["InfraId"]] = f"the infra container of {about['what']}: {why}"
        elif dry_run:
            done.outcomes.append(Outcome.done(detail="dry run: would remove", **about))
        else:
            ok, detail = attempt(functools.partial(engine.remove_pod, pod["Id"]))
            done.outcomes.append(Outcome(ok=ok, detail=detail, **about))
    return done


def _holds(engine: Engine, pod: dict[str, Any], owner: Owner) -> str | None:
    """Why `pod` must stay: a container in it of a live owner, or one to be kept; else None.
    Unlabelled containers, and a dead owner's, go with it. Raises what the engine does."""
    for member in pod.get("Containers") or []:
        cid = member.get("Id") if isinstance(member, dict) else None
        if not isinstance(cid, str) or cid == pod.get("InfraId"):
            continue
        try:
            labels = (engine.inspect(cid).get("Config") or {}).get("Labels") or {}
        except NotFound:  # gone meanwhile
            continue
        name = member.get("Names") or cid[:12]
        if kept(labels):
            return f"it holds container {name}, labelled exitwatch.keep=true"
        try:
            other = Owner.parse(labels.get(LABEL_OWNER, ""))
        except OwnerError:
            continue
        if other != owner and death(other) is None:
            return f"it holds container {name} of live owner {other}"
    return None
