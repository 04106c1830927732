"""The owner string `<boot_id>:<pid>:<starttime>`: parse, format and liveness."""

from __future__ import annotations

import functools
import os
import re
import signal
from dataclasses import dataclass

from exitwatch import procfs

# PID_MAX_LIMIT on 64-bit Linux.
PID_MAX = 4 * 1024 * 1024
MAX_OWNER_LEN = 128
_BOOT_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_DIGITS = re.compile(r"[0-9]{1,20}")


class OwnerError(ValueError):
    """A malformed owner string. Such an owner is never treated as dead."""


@dataclass(frozen=True, order=True)
class Owner:
    boot_id: str
    pid: int
    starttime: int

    def __str__(self) -> str:
        return f"{self.boot_id}:{self.pid}:{self.starttime}"

    @classmethod
    def parse(cls, text: str) -> Owner:
        if not isinstance(text, str):
            raise OwnerError(f"owner must be a string, not {type(text).__name__}")
        if len(text) > MAX_OWNER_LEN:
            raise OwnerError(f"owner is {len(text)} characters long, at most {MAX_OWNER_LEN}")
        parts = text.split(":")
        if len(parts) != 3:
            raise OwnerError(f"owner {text!r} is not <boot_id>:<pid>:<starttime>")
        boot, pid, start = parts
        if not _BOOT_ID.fullmatch(boot):
            raise OwnerError(f"owner {text!r}: boot id {boot!r} is not a lowercase UUID")
        if not _DIGITS.fullmatch(pid) or not 0 < int(pid) <= PID_MAX:
            raise OwnerError(f"owner {text!r}: pid {pid!r} is not an integer in 1..{PID_MAX}")
        if not _DIGITS.fullmatch(start) or int(start) >= 2**64:
            raise OwnerError(f"owner {text!r}: start time {start!r} is not a 64-bit tick count")
        return cls(boot, int(pid), int(start))


@functools.cache
def current_boot_id() -> str:
    return procfs.boot_id()


def owner_of(pid: int | None = None) -> Owner:
    """The owner identity of a live process (default: the calling one).

    Raises ProcessLookupError if there is no such process, and OwnerError where this
    process's pids or start times are not the host's, since the agent judges owners by
    those.
    """
    foreign = procfs.foreign_namespace("pid", "time")
    if foreign is not None:
        raise OwnerError(
            f"inside a container (not in the host's {foreign} namespace): pids and start "
            "times seen here would name other processes to the agent. For what a container "
            "creates, use `exitwatch adopt` (exitwatch-adopt(8)); else name owners from the host"
        )
    pid = os.getpid() if pid is None else pid
    return Owner(current_boot_id(), pid, procfs.read_stat(pid).starttime)


def describe_status(status: int | None) -> str:
    """How a process ended, from its raw wait status."""
    if status is None:
        return "unknown"
    if status & 0x7F == 0:
        return f"exited with code {(status >> 8) & 0xFF}"
    signo = status & 0x7F
    try:
        name = signal.Signals(signo).name
    except ValueError:
        name = f"signal {signo}"
    return f"killed by {name}"


def death(owner: Owner) -> str | None:
    """Why the owner is dead, or None while it lives.

    Alive means: same boot, /proc/PID/stat present with the same start time, and not a
    zombie (or dead) with a single task left. Anything else is dead.
    """
    if owner.boot_id != current_boot_id():
        return "boot id differs (host rebooted)"
    try:
        stat = procfs.read_stat(owner.pid)
    except ProcessLookupError:
        return "process gone"
    if stat.starttime != owner.starttime:
        return "pid reused (start time differs)"
    # A leader that exited before its threads shows Z with num_threads > 1: still alive.
    if stat.state in ("Z", "X", "x") and stat.num_threads <= 1:
        if stat.exit_code == 0 and not reads_exit_codes():
            # The kernel shows 0 in place of the code to whom may not ptrace the process.
            return "zombie, how it ended unknown (its exit code needs CAP_SYS_PTRACE to read)"
        return f"zombie, {describe_status(stat.exit_code)}"
    return None


@functools.cache
def reads_exit_codes() -> bool:
    """Whether /proc/PID/stat shows this process other processes' exit codes: those of
    processes it may not ptrace read as 0 (the agent as root without CAP_SYS_PTRACE in its
    bounding set reads none, root's own processes included)."""
    return procfs.capable(procfs.CAP_SYS_PTRACE)
