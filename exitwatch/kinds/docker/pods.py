"""Podman's pods labelled with an ended owner: each removed with its containers before the
owner's containers are, since podman removes a pod's infra container only with its pod (it
refuses a removal of that container alone). A pod carries its owner as a container does:
`podman pod create` is labelled by the proxies, and its infra container takes the pod's
labels, which is how the index hears of it. Another engine has no pods: nothing to do."""

from __future__ import annotations

import functools

from exitwatch.contract import LABEL_OWNER, kept
from exitwatch.engine.api import Engine
from exitwatch.engine.client import ENGINE_ERRORS
from exitwatch.engine.errors import describe
from exitwatch.kinds.base import Outcome
from exitwatch.kinds.docker.attempts import attempt
from exitwatch.owner import Owner

POD = "pod"


def labelled(engine: Engine, owner: Owner, dry_run: bool) -> list[Outcome]:
    """Remove the pods labelled with `owner` (not those labelled exitwatch.keep=true)."""
    try:
        pods = engine.pods(f"{LABEL_OWNER}={owner}")
    except ENGINE_ERRORS as err:
        why = f"listing the pods of {owner}: {describe(err)}"
        return [Outcome.failed(f"pods of {owner}", POD, why)]
    outcomes = []
    for pod in pods:
        if kept(pod.get("Labels") or {}):
            continue
        about = {"what": f"pod {pod.get('Name', '')}", "kind": POD, "extra": {"id": pod["Id"]}}
        if dry_run:
            outcomes.append(Outcome.done(detail="dry run: would remove", **about))
            continue
        ok, detail = attempt(functools.partial(engine.remove_pod, pod["Id"]))
        outcomes.append(Outcome(ok=ok, detail=detail, **about))
    return outcomes
