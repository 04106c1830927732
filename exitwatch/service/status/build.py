"""The status document, built in one place for both of its views: a running agent's, served
on the status socket, and the one-shot scan's (`exitwatch status` with no agent answering).
docs/operations.md gives its schema; SCHEMA changes when a key changes its meaning."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict
from typing import Any, TypedDict, cast

from exitwatch.agent.loop import Agent
from exitwatch.agent.reconcile import Last, Periodic
from exitwatch.agent.record import Recorder
from exitwatch.agent.removals import Pending
from exitwatch.kinds import registry
from exitwatch.kinds.base import Resource, ResourceKind, Unavailable
from exitwatch.owner import Owner, current_machine_id, death, elsewhere
from exitwatch.service.status.schema import (
    AgentInfo,
    ElsewhereEntry,
    LastReconcile,
    OwnerEntry,
    PendingEntry,
    ReapEntry,
    Reconcile,
    Status,
)

SCHEMA = 1
BUSY = "the agent's loop did not answer in time"
ORDER = tuple(reg.kind for reg in registry.KINDS)  # how an owner's resources are listed


def of_agent(
    agent: Agent, kinds: Mapping[str, ResourceKind], recorder: Recorder, info: AgentInfo
) -> Status:
    """The running agent's document. What the index holds is read on the agent's loop
    thread, through ask(); a loop too busy to answer says so rather than stall the client."""

    def held() -> _Held:
        index = agent.index
        here, away = _split({o: index.resources(o) for o in index.owners()})
        return {
            "owners": here,
            "elsewhere": away,
            "pending": [_job(p) for p in agent.pending()],
            "reconcile": _reconcile(agent.periodic),
        }

    doc: Status = {
        "schema": SCHEMA,
        "agent": info | {"uptime_s": round(time.time() - info["started_at"], 1)},
        "machine": current_machine_id() or None,
        "owners": [],
        "elsewhere": [],
        "pending": [],
    }
    _health(doc, {name: kind.health() for name, kind in kinds.items()})
    try:
        body = agent.ask(held)
        doc |= {"owners": body["owners"], "elsewhere": body["elsewhere"]}
        doc["pending"] = body["pending"]
        doc["reconcile"] = body["reconcile"]
    except TimeoutError:
        doc["busy"] = BUSY
    doc["reaps"] = [cast(ReapEntry, asdict(r)) for r in recorder.reaps()]
    doc["counters"] = agent.counters()
    return doc


class _Held(TypedDict):
    """What the index holds, read on the agent's loop thread."""

    owners: list[OwnerEntry]
    elsewhere: list[ElsewhereEntry]
    pending: list[PendingEntry]
    reconcile: Reconcile


def _health(doc: Status, health: Mapping[str, Mapping[str, Any]]) -> None:
    """Each kind's health entry, under the key it declares: a kind's own typed dictionary,
    which schema.Status names, so the checker sees it only through the kind."""
    for reg in registry.KINDS:
        if reg.health_key and reg.kind in health:
            cast(dict, doc)[reg.health_key] = health[reg.kind]


def of_scan(kinds: Mapping[str, ResourceKind]) -> Status:
    """What a one-shot scan finds, read-only: live owners, and orphans waiting. A kind that
    cannot be listed is one line in `not_listed`, or, when what it lists from does not
    answer (the engine), its health entry says so; the markers the walk warned of are
    counted, not shown."""
    health: dict[str, Mapping[str, Any]] = {}
    held: dict[Owner, list[Resource]] = {}
    skipped, unlisted = 0, []
    for reg in registry.KINDS:
        kind = kinds.get(reg.kind)
        if kind is None:
            continue
        error: Unavailable | None = None
        try:
            snapshot = kind.scan()
        except Unavailable as err:
            error = err
        except (OSError, ValueError) as err:  # a spool a user may not list, say
            unlisted.append(f"{kind.kind}s: {err}")
            continue
        if shown := kind.scan_health(error):
            health[reg.kind] = shown
        if error is not None:
            continue
        skipped += snapshot.skipped
        for res in snapshot.resources:
            held.setdefault(res.owner, []).append(res)
    # Another machine's owner is never dead here (owner.death): it joins the live ones in
    # _split, which tells them apart.
    verdicts = {owner: death(owner) for owner in sorted(held)}
    owners, away = _split({o: held[o] for o, why in verdicts.items() if why is None})
    pending = [_pending(o, why, held[o]) for o, why in verdicts.items() if why is not None]
    doc: Status = {
        "schema": SCHEMA,
        "agent": None,
        "machine": current_machine_id() or None,
        "owners": owners,
        "elsewhere": away,
        "pending": pending,
        "skipped_markers": skipped,
        "not_listed": unlisted,
    }
    _health(doc, health)
    return doc


def _split(held: Mapping[Owner, list[Resource]]) -> tuple[list[OwnerEntry], list[ElsewhereEntry]]:
    """This machine's owners and other machines' (owner.elsewhere), each with what it
    holds, in order."""
    here: list[OwnerEntry] = []
    away: list[ElsewhereEntry] = []
    for owner in sorted(held):
        why = elsewhere(owner)
        if why is None:
            here.append(_owner(owner, held[owner]))
        else:
            entry = _owner(owner, held[owner]) | {"machine": owner.machine, "why": why}
            away.append(cast(ElsewhereEntry, entry))
    return here, away


def _owner(owner: Owner, held: Iterable[Resource]) -> OwnerEntry:
    """A live owner and what it holds, each kind's under its table's name."""
    of: dict[str, list[Resource]] = {kind: [] for kind in ORDER}
    for res in held:
        of.setdefault(res.kind, []).append(res)
    named = sorted({r.owner_name for rs in of.values() for r in rs if r.owner_name})
    entry = {
        "owner": str(owner),
        "pid": owner.pid,
        # What the owner is, as its resources say (exitwatch adopt's "container NAME").
        "name": "; ".join(named) or None,
        **{k: v for reg in registry.KINDS for k, v in reg.entries(of[reg.kind]).items()},
    }
    return cast(OwnerEntry, entry)  # one key per kind's table and part: registry.KINDS


def _pending(owner: Owner, why: str, held: Iterable[Resource]) -> PendingEntry:
    """A dead owner's resources waiting for their removal."""
    rank = {kind: i for i, kind in enumerate(ORDER)}
    order = sorted(held, key=lambda r: (rank.get(r.kind, len(ORDER)), r.name or r.key))
    return {"owner": str(owner), "death": why, "what": [r.name or r.key for r in order]}


def _job(pending: Pending) -> PendingEntry:
    """A removal job of the agent's: running, waiting to retry, or given up."""
    job = pending.job
    item = _pending(job.owner, job.death, job.resources)
    item["kind"], item["attempt"], item["state"] = job.kind.kind, job.attempt, pending.state
    if pending.due is not None:
        item["retry_in_s"] = round(max(0.0, pending.due - time.monotonic()), 1)
    return item


def _reconcile(periodic: Periodic) -> Reconcile:
    """The interval, the last reconcile, and when the next is due."""
    next_in = periodic.next_in(time.monotonic())
    return {
        "interval_s": periodic.interval,
        "running": periodic.running,
        "next_in_s": None if next_in is None else round(next_in, 1),
        "last": None if periodic.last is None else _last(periodic.last),
    }


def _last(last: Last) -> LastReconcile:
    if last.run == 0:
        return {"at": round(last.at, 3), "run": 0, "start_up": True}
    return {
        "at": round(last.at, 3),
        "run": last.run,
        "took_s": round(last.took, 3),
        "listed": last.listed,
        "missed": last.missed,
        "orphaned": last.orphaned,
        "errors": list(last.errors),
    }
