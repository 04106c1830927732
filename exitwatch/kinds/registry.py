"""The kinds of resource, in the order an owner's resources are listed: the one module that
names them. Each declares itself in its registration.py (a Registration: its settings table, health,
status keys and metrics); the service, the status document and its text, the metrics, the
config file and `exitwatch reap` iterate KINDS, as the exit sources iterate
sources.CANDIDATES. A new kind is one package and one line here."""

from __future__ import annotations

from exitwatch.kinds.base import Registration
from exitwatch.kinds.docker import registration as containers
from exitwatch.kinds.docker.kind import DockerHealth
from exitwatch.kinds.hooks import registration as hooks
from exitwatch.kinds.leases import registration as leases
from exitwatch.kinds.leases.kind import LeasesHealth
from exitwatch.kinds.processes import registration as processes
from exitwatch.kinds.processes.kind import ProcessesHealth
from exitwatch.kinds.watchdogs import registration as watchdogs
from exitwatch.kinds.watchdogs.kind import WatchdogsHealth
from exitwatch.kinds.workdirs import registration as workdirs
from exitwatch.kinds.workdirs.kind import WorkdirsHealth

# The kinds' health entries of the status document, for service/status/schema.py.
__all__ = [
    "KINDS",
    "DockerHealth",
    "LeasesHealth",
    "ProcessesHealth",
    "WatchdogsHealth",
    "WorkdirsHealth",
    "by_kind",
]

KINDS: tuple[Registration, ...] = (
    containers.REGISTRATION,
    workdirs.REGISTRATION,
    hooks.REGISTRATION,
    leases.REGISTRATION,
    watchdogs.REGISTRATION,
    processes.REGISTRATION,
)


def by_kind(kind: str) -> Registration:
    """The registration of the kind named `kind` ("container")."""
    return next(reg for reg in KINDS if reg.kind == kind)
