"""A container's owner, as its labels say: read, checked, and made a Resource."""

from __future__ import annotations

import logging
from typing import Any

from exitwatch.contract import LABEL_COMPOSE_PROJECT, LABEL_OWNER, LABEL_OWNER_NAME, kept
from exitwatch.kinds.base import Resource
from exitwatch.owner import Owner, OwnerError

log = logging.getLogger(__name__)


def owner_from(cid: str, name: str, labels: dict[str, str], then: str) -> Owner | None:
    """The owner a container's label names; None, and one warning, when it is malformed."""
    try:
        return Owner.parse(labels.get(LABEL_OWNER, ""))
    except OwnerError as err:
        log.warning("container %s (%s): label %s: %s; %s", name, cid[:12], LABEL_OWNER, err, then)
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
    project = labels.get(LABEL_COMPOSE_PROJECT) or None
    about = str(labels.get(LABEL_OWNER_NAME, ""))
    return Resource(kind, cid, owner, name, project, owner_name=about)
