"""A container's, network's or volume's owner, as its labels say: read, checked, and made a
Resource of the container kind. Networks and volumes are resources of that kind too, keyed
"network:ID" and "volume:NAME" (a container's key is its id), so that one removal job
takes an owner's containers first and then what they used, under one compose rule."""

from __future__ import annotations

import logging
from typing import Any

from exitwatch.contract import LABEL_OWNER, LABEL_OWNER_NAME, kept
from exitwatch.kinds.base import Resource
from exitwatch.kinds.docker.compose import project_of
from exitwatch.owner import Owner, OwnerError

log = logging.getLogger(__name__)

CONTAINER, NETWORK, VOLUME = "container", "network", "volume"


def key_of(type_: str, ident: str) -> str:
    """The Resource key of a container (its id), a network ("network:ID") or a volume
    ("volume:NAME")."""
    return ident if type_ == CONTAINER else f"{type_}:{ident}"


def split(key: str) -> tuple[str, str]:
    """(type, the engine's id or name) of a Resource key of the container kind."""
    type_, colon, ident = key.partition(":")
    return (type_, ident) if colon and type_ in (NETWORK, VOLUME) else (CONTAINER, key)


def owner_from(cid: str, name: str, labels: dict[str, str], then: str) -> Owner | None:
    """The owner a container's label names; None, and one warning, when it is malformed."""
    return _owner(f"container {name} ({cid[:12]})", labels, then)


def _owner(what: str, labels: dict[str, str], then: str) -> Owner | None:
    try:
        return Owner.parse(labels.get(LABEL_OWNER, ""))
    except OwnerError as err:
        log.warning("%s: label %s: %s; %s", what, LABEL_OWNER, err, then)
        return None


def carries(listed: dict[str, Any], owner: Owner) -> bool:
    """Whether a listed container carries `owner`'s label (kept or not)."""
    try:
        return Owner.parse((listed.get("Labels") or {}).get(LABEL_OWNER, "")) == owner
    except OwnerError:
        return False


def resource_of(kind: str, cid: str, name: str, labels: dict[str, str]) -> Resource | None:
    """The Resource of the kind `kind` for one labelled container; None when it is kept or
    its label is bad."""
    owner = None if kept(labels) else owner_from(cid, name, labels, "skipped")
    if owner is None:
        return None
    project = project_of(labels)
    about = str(labels.get(LABEL_OWNER_NAME, ""))
    return Resource(kind, cid, owner, name, project, owner_name=about)


def other_of(kind: str, type_: str, listed: dict[str, Any]) -> Resource | None:
    """The Resource of the kind `kind` for one labelled network or volume (`type_`) as the
    engine lists or inspects it; None when it is unlabelled, kept or its label is bad. Its
    name, for people, says which it is: "volume NAME"."""
    labels = listed.get("Labels") or {}
    ident = listed.get("Id" if type_ == NETWORK else "Name")
    if not isinstance(labels, dict) or LABEL_OWNER not in labels or not isinstance(ident, str):
        return None
    name = f"{type_} {listed.get('Name', ident)}"
    owner = None if kept(labels) else _owner(name, labels, "skipped")
    if owner is None:
        return None
    project = project_of(labels)
    about = str(labels.get(LABEL_OWNER_NAME, ""))
    return Resource(kind, key_of(type_, ident), owner, name, project, owner_name=about)
