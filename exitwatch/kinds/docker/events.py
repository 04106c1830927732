"""What an engine says, as changes of the container kind: a whole listing (a Snapshot), and
what one event of the stream changes (a Found, a Gone, or nothing). Docker's and podman's
events differ (docs/podman.md); this is where both are read."""

from __future__ import annotations

from typing import Any

from exitwatch.contract import LABEL_OWNER, kept
from exitwatch.engine import api
from exitwatch.engine.errors import NotFound
from exitwatch.kinds.base import Change, Found, Gone, Snapshot
from exitwatch.kinds.docker.attempts import name_of
from exitwatch.kinds.docker.labels import (
    CONTAINER,
    KIND,
    NETWORK,
    VOLUME,
    key_of,
    other_of,
    resource_of,
)

# What the events stream follows: the kind's three types of resource, created or gone
# (podman says "remove" where Docker says "destroy"; docs/podman.md).
TYPES = (CONTAINER, VOLUME, NETWORK)
GONE = ("destroy", "remove")


def snapshot(engine: api.Engine) -> Snapshot:
    """Every labelled container, network and volume now, as resources of the kind."""
    listed = engine.each_container(LABEL_OWNER)
    found = [resource_of(KIND, c["Id"], name_of(c), c.get("Labels") or {}) for c in listed]
    found += [other_of(KIND, NETWORK, n) for n in engine.networks(LABEL_OWNER)]
    found += [other_of(KIND, VOLUME, v) for v in engine.volumes(LABEL_OWNER)]
    return Snapshot(KIND, tuple(r for r in found if r is not None))


def change(engine: api.Engine, event: dict[str, Any]) -> Change | None:
    """What one event of the stream changes: a labelled container, network or volume
    created (Found) or one destroyed (Gone), or nothing. A container's event carries its
    labels; a volume's or network's none, so the new one is asked for its own (what raises
    then makes the stream be followed again, after a listing). Raises what the engine does."""
    type_, action = event.get("Type", CONTAINER), event.get("Action")
    actor = event.get("Actor") or {}
    ident, labels = actor.get("ID"), actor.get("Attributes") or {}
    if type_ == VOLUME and not ident:  # podman 4.3 names a volume in its attributes alone
        ident = labels.get("name")
    if not ident or not isinstance(ident, str) or type_ not in TYPES:
        return None
    if type_ == CONTAINER and (LABEL_OWNER not in labels or kept(labels)):
        return None
    if action in GONE:
        return Gone(KIND, key_of(type_, ident))
    if action != "create":
        return None
    if type_ == CONTAINER:
        res = resource_of(KIND, ident, labels.get("name", ""), labels)
    else:
        try:
            listed = engine.volume(ident) if type_ == VOLUME else engine.network(ident)
        except NotFound:  # gone already: its destroy follows
            return None
        res = other_of(KIND, type_, listed)
    return None if res is None else Found(res)


def ns_time(ns: int) -> str:
    """A `since` the engine reads to the nanosecond."""
    return f"{ns // 1_000_000_000}.{ns % 1_000_000_000:09d}"
