"""The periodic reconcile's bookkeeping on its own (agent/reconcile.py, Periodic): what the
loop journalled while a scan was under way is laid over the scan's stale listing, a kind
whose watcher sent a fresher Snapshot meanwhile is dropped from it, and the next one is
due an interval after. unit/test_reconcile.py runs it inside the agent's loop."""

from __future__ import annotations

import queue
import time

import pytest

from exitwatch.agent.reconcile import Periodic, Scanned
from exitwatch.kinds.base import Resource, Snapshot
from exitwatch.owner import owner_of

from support.things import DEAD, Things, thing

ALIVE = owner_of()
INTERVAL = 60.0


class Others(Things):
    kind = "other"


def other(key: str) -> Resource:
    return Resource("other", key, DEAD, key)


@pytest.fixture
def scans() -> queue.SimpleQueue:
    """What the reconciles submit, as the agent's queue would take it."""
    return queue.SimpleQueue()


def scan(periodic: Periodic, scans: queue.SimpleQueue) -> Scanned:
    """Start the reconcile as if it were due, and take what its scan submits; the run stays
    under way (journalling) until it is merged."""
    periodic.tick(time.monotonic() + 2 * INTERVAL)
    scanned = scans.get(timeout=10)
    assert isinstance(scanned, Scanned)
    return scanned


def by_kind(snapshots: list[Snapshot]) -> dict[str, dict[str, Resource]]:
    return {s.kind: {r.key: r for r in s.resources} for s in snapshots}


def test_changes_journalled_during_a_scan_are_laid_over_its_listing(scans):
    kind = Things()
    kind.listing = (thing("old"), thing("deleted"), thing("rewritten"))
    periodic = Periodic(INTERVAL, [kind])
    periodic.start(scans.put)
    scanned = scan(periodic, scans)
    # What the loop handled while the listing was being made: newer than the listing.
    periodic.changed("thing", "new", thing("new"))
    periodic.changed("thing", "deleted", None)
    periodic.changed("thing", "rewritten", thing("rewritten", ALIVE))
    periodic.changed("thing", "never-listed", None)  # gone before the listing saw it
    [merged] = periodic.merge(scanned)
    assert merged.kind == "thing"
    held = {r.key: r.owner for r in merged.resources}
    assert held == {"old": DEAD, "new": DEAD, "rewritten": ALIVE}


def test_the_latest_change_of_a_resource_wins(scans):
    kind = Things()
    periodic = Periodic(INTERVAL, [kind])
    periodic.start(scans.put)
    scanned = scan(periodic, scans)
    periodic.changed("thing", "x", thing("x"))
    periodic.changed("thing", "x", None)  # found, then gone again
    periodic.changed("thing", "y", None)
    periodic.changed("thing", "y", thing("y", ALIVE))  # gone, then found again
    [merged] = periodic.merge(scanned)
    assert {r.key: r.owner for r in merged.resources} == {"y": ALIVE}


def test_a_change_touches_only_its_own_kinds_listing(scans):
    things, others = Things(), Others()
    things.listing = (thing("a"),)
    others.listing = (other("a"),)
    periodic = Periodic(INTERVAL, [things, others])
    periodic.start(scans.put)
    scanned = scan(periodic, scans)
    periodic.changed("other", "a", None)
    periodic.changed("other", "b", other("b"))
    merged = by_kind(periodic.merge(scanned))
    assert set(merged["thing"]) == {"a"}
    assert set(merged["other"]) == {"b"}


def test_a_kind_superseded_by_its_watchers_snapshot_is_dropped(scans):
    things, others = Things(), Others()
    things.listing = (thing("a"),)
    others.listing = (other("stale"),)
    periodic = Periodic(INTERVAL, [things, others])
    periodic.start(scans.put)
    scanned = scan(periodic, scans)
    periodic.replaced("other")  # the watcher's own Snapshot of it is newer than the scan's
    merged = periodic.merge(scanned)
    assert [s.kind for s in merged] == ["thing"]
    assert set(by_kind(merged)["thing"]) == {"a"}


def test_what_happened_outside_a_scan_is_not_journalled(scans):
    kind = Things()
    kind.listing = (thing("a"),)
    periodic = Periodic(INTERVAL, [kind])
    periodic.start(scans.put)
    # Before the scan: the listing that follows already shows it (or not).
    periodic.changed("thing", "a", None)
    periodic.replaced("thing")
    scanned = scan(periodic, scans)
    [merged] = periodic.merge(scanned)
    assert {r.key for r in merged.resources} == {"a"}
    # After the merge the run is over: the next scan's merge starts from a clean journal.
    periodic.changed("thing", "a", None)
    periodic.replaced("thing")
    [again] = periodic.merge(scan(periodic, scans))
    assert {r.key for r in again.resources} == {"a"}


def test_no_reconcile_starts_while_one_lists_and_the_next_is_due_an_interval_after(scans):
    kind = Things()
    kind.release.clear()  # the scan is held
    periodic = Periodic(INTERVAL, [kind])
    assert periodic.timeout(time.monotonic()) is None  # not started yet
    periodic.start(scans.put)
    periodic.tick(time.monotonic() + 2 * INTERVAL)
    assert kind.scanning.wait(10)
    assert periodic.timeout(time.monotonic() + 2 * INTERVAL) is None
    assert periodic.running
    periodic.tick(time.monotonic() + 3 * INTERVAL)  # still listing: no second scan
    kind.release.set()
    scanned = scans.get(timeout=10)
    before = time.monotonic()
    periodic.merge(scanned)
    after = time.monotonic()
    assert kind.scans == 1
    assert not periodic.running
    assert before + INTERVAL <= after + periodic.timeout(after) <= after + INTERVAL


def test_an_interval_of_zero_never_reconciles(scans):
    periodic = Periodic(0, [Things()])
    periodic.start(scans.put)
    assert periodic.timeout(time.monotonic() + 10 * INTERVAL) is None
    assert periodic.next_in(time.monotonic()) is None
