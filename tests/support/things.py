"""The one fake resource kind of the unit tests of the agent's loop and its reconcile: a
kind "thing" whose listing the test sets, whose scans and removals the test can hold, and
whose removals succeed or fail as told. The owners are real: DEAD is this process's pid
with another start time (a reused pid)."""

from __future__ import annotations

import threading

from exitwatch.kinds.base import Outcome, Resource, ResourceKind, Snapshot
from exitwatch.owner import Owner

from support.procs import reused_pid_owner

DEAD = reused_pid_owner()


class Things(ResourceKind):
    """A kind whose listing is `self.listing` (what start() reports, and what scan() lists
    as it was when the scan began). Clearing `release` holds a scan, clearing `removal`
    holds a removal; `fail` makes removals fail. `calls` has the keys of each removal."""

    kind = "thing"

    def __init__(self, fail: bool = False) -> None:
        self.listing: tuple[Resource, ...] = ()
        self.fail = fail
        self.calls: list[list[str]] = []
        self.scans = 0
        self.scanning = threading.Event()
        self.release = threading.Event()
        self.release.set()
        self.removal = threading.Event()
        self.removal.set()

    def scan(self) -> Snapshot:
        listing = self.listing  # what exists when the scan begins
        self.scans += 1
        self.scanning.set()
        self.release.wait(10)
        return Snapshot(self.kind, listing)

    def start(self, notify) -> None:
        notify(Snapshot(self.kind, self.listing))

    def stop(self) -> None:
        pass

    def remove(self, owner, resources, dry_run, how) -> list[Outcome]:
        self.calls.append([r.key for r in resources])
        self.removal.wait(10)
        return [
            Outcome(what=f"thing {r.key}", kind=self.kind, ok=not self.fail, detail="nope")
            for r in resources
        ]


def thing(key: str, owner: Owner = DEAD) -> Resource:
    """A thing named `key`, of `owner` (dead unless told)."""
    return Resource("thing", key, owner, key)
