"""Which members of a dead owner's compose project provably belong to the owner's instance
of it. A project *name* is no identity: compose defaults it to the directory's basename, so
an eval's `app` and a long-lived production `app` share one. kind.py asks; this module
only judges, from labels and creation times, by the rule of docs/contract.md ("Compose
projects").
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from exitwatch import procfs
from exitwatch.contract import LABEL_COMPOSE_PROJECT
from exitwatch.owner import Owner, current_boot_id

LABEL_WORKING_DIR = "com.docker.compose.project.working_dir"
LABEL_CONFIG_FILES = "com.docker.compose.project.config_files"
# What names a project: docker compose's label, or podman-compose's. podman-compose (1.0.3
# and on) puts both, and compose's working directory and config files labels, on what it
# makes; a container, network or volume that bears podman's alone is of its project too.
PROJECT_LABELS = (LABEL_COMPOSE_PROJECT, "io.podman.compose.project")
_RFC3339 = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)")
# The most two readings of the boot time may differ before the wall clock counts as stepped
# (or shifted): btime is rounded down to the second, and a leap second is one.
STEP = 1.0


def boot_time() -> float:
    """The unix time the host booted, by this process's wall clock now (to the ns)."""
    return time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)


def started_at(owner: Owner, seen: float | None = None) -> float | str:
    """The unix time the owner started, to compare with the engine's creation times; or
    why that comparison would prove nothing. `seen` is boot_time() as it was when the
    owner was first seen (None: now).

    The start time counts whole clock ticks since boot, so this is at most a tick early: a
    container the owner created is never judged older. It is turned into wall time with
    the boot time, which is only as good as the wall clock: the engine stamped `Created`
    with the clock of then, and a clock stepped back since would make an older sibling
    look younger. So the boot time must read the same now, when the owner was first seen,
    and by the kernel's own clock (btime: a clock shifted for this process alone), within
    STEP; the later reading is taken, which errs towards the owner having started later.
    docs/contract.md ("Compose projects") says what this costs."""
    if owner.boot_id != current_boot_id():
        return "its owner ran in an earlier boot, so which started first is unknown"
    now = boot_time()
    try:
        kernel = procfs.btime()
    except (OSError, ValueError) as err:
        return f"the kernel's boot time cannot be read ({err}), so no clock can be trusted"
    cannot = "so creation times prove no order"
    if not kernel - STEP <= now < kernel + 1 + STEP:
        off = f"{now - kernel:+.0f} s"
        return f"this process's wall clock is {off} off the kernel's boot time, {cannot}"
    if seen is not None and abs(now - seen) > STEP:
        step = f"{now - seen:+.0f} s"
        return f"the wall clock was stepped by {step} since its owner was first seen, {cannot}"
    booted = now if seen is None else max(now, seen)
    return booted + owner.starttime / os.sysconf("SC_CLK_TCK")


def unix_time(text: object) -> float | None:
    """An engine timestamp (RFC 3339, to the nanosecond) as unix time; None if it is not one."""
    m = _RFC3339.fullmatch(text) if isinstance(text, str) else None
    if m is None:
        return None
    zone = "+00:00" if m[3] == "Z" else m[3]
    whole = datetime.fromisoformat(m[1] + zone).timestamp()
    return whole + (int(m[2]) / 10 ** len(m[2]) if m[2] else 0.0)


def project_of(labels: dict[str, Any]) -> str | None:
    """The compose project its labels name (PROJECT_LABELS, in order), or None."""
    for key in PROJECT_LABELS:
        name = labels.get(key)
        if isinstance(name, str) and name:
            return name
    return None


def instance(labels: dict[str, str]) -> tuple[str, str] | None:
    """What names one project instance: its working directory and config files."""
    where = labels.get(LABEL_WORKING_DIR)
    return (where, labels.get(LABEL_CONFIG_FILES, "")) if where else None


def why_not_ours(labels: dict[str, str], owned: Iterable[tuple[str, str] | None]) -> str | None:
    """Why an unlabelled container's labels do not prove it of the owner's project instance
    (`owned`: the instances of the owner's containers), or None when they do."""
    mine = instance(labels)
    if mine is None:
        return "it has no compose working directory label"
    if mine not in set(owned):
        return f"its compose working directory and config files ({mine[0]}) are not its owner's"
    return None


def why_started_before(state: Any, owner: Owner) -> str | None:
    """Why a container whose engine state is `state` provably predates `owner`: it runs a
    process that started before the owner did, by the ticks since boot, which no clock
    step moves. None when that proves nothing (not running, or its process is gone)."""
    pid = state.get("Pid") if isinstance(state, dict) and state.get("Running") else None
    if not isinstance(pid, int) or pid <= 0 or owner.boot_id != current_boot_id():
        return None
    try:
        started = procfs.read_stat(pid).starttime
    except OSError:  # gone, or cannot be read now: no proof either way
        return None
    if started < owner.starttime:
        return "its main process started before its owner did"
    return None


def why_older(created: object, since: float | str) -> str | None:
    """Why something created at `created` (an engine timestamp) is not proven younger than
    its owner, who started at `since` (started_at: a time, or why there is none); None
    when it is."""
    if isinstance(since, str):
        return since
    when = unix_time(created)
    if when is None:
        return f"its creation time {created!r} cannot be read"
    if when < since:
        return "it was created before its owner started"
    return None
