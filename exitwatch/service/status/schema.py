"""The status document's shape (schema 1), as typed dictionaries: what build.py makes, the
status socket serves, text.py renders and docs/operations.md ("The JSON document") tells.
`make lint` type-checks the builder against it, so that a key changed in one place and not
in the other fails there. Each kind's health entry is typed beside its health()."""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict

from exitwatch.kinds.registry import (
    DockerHealth,
    LeasesHealth,
    ProcessesHealth,
    WatchdogsHealth,
    WorkdirsHealth,
)


class AgentInfo(TypedDict):
    version: str
    pid: int
    started_at: float  # unix time
    uptime_s: NotRequired[float]  # added when the document is built
    source: str
    source_reason: str
    dry_run: bool
    config: dict[str, Any]  # every setting, as the config file has them


class ContainerHeld(TypedDict):
    id: str
    name: str
    project: str | None


class NetworkHeld(TypedDict):
    id: str
    name: str
    project: str | None


class VolumeHeld(TypedDict):
    name: str
    project: str | None


class OwnerEntry(TypedDict):
    """A live owner and what it holds: one key per kind's table and part
    (kinds/registry.py; the container kind's networks and volumes are its parts)."""

    owner: str
    pid: int
    name: str | None
    containers: list[ContainerHeld]
    networks: list[NetworkHeld]
    volumes: list[VolumeHeld]
    workdirs: list[str]
    hooks: list[str]
    leases: list[str]
    watchdogs: list[str]
    processes: list[str]


class ElsewhereEntry(OwnerEntry):
    """An owner of another machine and what it holds here (a shared engine, a shared
    filesystem): left alone, whether it lives or not, which this agent cannot tell."""

    machine: str  # its machine id
    why: str  # why it is not this machine's


class PendingEntry(TypedDict):
    owner: str
    death: str
    what: list[str]
    # A running agent's jobs only:
    kind: NotRequired[str]
    attempt: NotRequired[int]
    state: NotRequired[str]
    retry_in_s: NotRequired[float]


class LastReconcile(TypedDict):
    at: float
    run: int
    start_up: NotRequired[bool]
    took_s: NotRequired[float]
    listed: NotRequired[int]
    missed: NotRequired[int]
    orphaned: NotRequired[int]
    errors: NotRequired[list[str]]


class Reconcile(TypedDict):
    interval_s: float
    running: bool
    next_in_s: float | None
    last: LastReconcile | None


class ReapEntry(TypedDict):
    time: float
    what: str
    kind: str
    owner: str
    death: str
    latency_ms: float
    result: str
    ok: bool
    refused: bool
    dry_run: bool


class Status(TypedDict):
    """The document: a running agent's (`agent` set) or a one-shot scan's (`agent` None)."""

    schema: int
    agent: AgentInfo | None
    machine: str | None  # this machine's id (owner.py); None when it has none
    docker: NotRequired[DockerHealth]
    workdirs: NotRequired[WorkdirsHealth]
    processes: NotRequired[ProcessesHealth]
    leases: NotRequired[LeasesHealth]
    watchdogs: NotRequired[WatchdogsHealth]
    owners: list[OwnerEntry]
    elsewhere: list[ElsewhereEntry]
    pending: list[PendingEntry]
    # A running agent's only:
    busy: NotRequired[str]
    reconcile: NotRequired[Reconcile]
    reaps: NotRequired[list[ReapEntry]]
    counters: NotRequired[dict[str, int]]
    # A one-shot scan's only:
    skipped_markers: NotRequired[int]
    not_listed: NotRequired[list[str]]
