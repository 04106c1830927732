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

from exitwatch.owner import Owner, current_boot_id

LABEL_WORKING_DIR = "com.docker.compose.project.working_dir"
LABEL_CONFIG_FILES = "com.docker.compose.project.config_files"
_RFC3339 = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)")


def started_at(owner: Owner) -> float | None:
    """The unix time the owner started, or None when it ran in an earlier boot (whose boot
    time is gone). The start time counts whole clock ticks since boot (CLOCK_BOOTTIME), so
    this is at most a tick early: a container the owner created is never judged older.
    (/proc/stat's btime would do, but it is rounded down to the second.)"""
    if owner.boot_id != current_boot_id():
        return None
    booted = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
    return booted + owner.starttime / os.sysconf("SC_CLK_TCK")


def unix_time(text: object) -> float | None:
    """An engine timestamp (RFC 3339, to the nanosecond) as unix time; None if it is not one."""
    m = _RFC3339.fullmatch(text) if isinstance(text, str) else None
    if m is None:
        return None
    zone = "+00:00" if m[3] == "Z" else m[3]
    whole = datetime.fromisoformat(m[1] + zone).timestamp()
    return whole + (int(m[2]) / 10 ** len(m[2]) if m[2] else 0.0)


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


def why_older(created: object, since: float | None) -> str | None:
    """Why something created at `created` (an engine timestamp) is not proven younger than
    its owner, who started at `since` (see started_at); None when it is."""
    if since is None:
        return "its owner ran in an earlier boot, so which started first is unknown"
    when = unix_time(created)
    if when is None:
        return f"its creation time {created!r} cannot be read"
    if when < since:
        return "it was created before its owner started"
    return None
