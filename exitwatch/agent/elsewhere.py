"""Owners of other machines: what they hold is none of this agent's business.

A container that a runner on another host made on a shared engine, or a workdir it marked
on a shared filesystem, names an owner whose machine id is not this one's
(owner.elsewhere). The loop neither watches nor judges such an owner, and removes nothing
of it, alive or not: it is told here once, and counted for status and the metrics.

Only the agent's loop thread calls these, so this state needs no lock.
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter, OrderedDict

from exitwatch.agent.index import Index
from exitwatch.owner import Owner, current_boot_id, current_machine, elsewhere

log = logging.getLogger(__name__)

TOLD = 4096  # owners remembered as told, so that one that holds things again is not retold


class Elsewhere:
    """Which owners were told of, most recent last."""

    def __init__(self) -> None:
        self._told: OrderedDict[Owner, None] = OrderedDict()
        # Read now, while they can be: a first reading under a full fd table would fail.
        with contextlib.suppress(OSError):
            current_machine()
            current_boot_id()

    def admit(self, owner: Owner) -> bool:
        """Whether `owner`, new to the index, is another machine's; the first time it is,
        one log line says so."""
        try:
            why = elsewhere(owner)
        except OSError:
            # Cannot be told now: judged as this machine's, whose death() cannot be read
            # either, so it is judged again (rechecks.py), and found another machine's then.
            return False
        if why is None:
            return False
        if owner in self._told:
            self._told.move_to_end(owner)
            return True
        self._told[owner] = None
        if len(self._told) > TOLD:
            self._told.popitem(last=False)
        log.info(
            "owner %s is %s: what it holds is left alone",
            owner,
            why,
            extra={"fields": {"event": "elsewhere", "owner": str(owner), "machine": owner.machine}},
        )
        return True


def held(index: Index) -> tuple[int, Counter[str]]:
    """How many owners in `index` are other machines', and their resources by kind."""
    owners, kinds = 0, Counter[str]()
    for owner in index.owners():
        try:
            away = elsewhere(owner) is not None
        except OSError:  # read at start (Elsewhere), the ids it needs never fail after
            away = False
        if away:
            owners += 1
            kinds.update(r.kind for r in index.resources(owner))
    return owners, kinds
