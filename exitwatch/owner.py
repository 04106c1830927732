"""The owner string `<machine_id>:<boot_id>:<pid>:<starttime>`: parse, format, liveness,
and whether an owner is this machine's to judge at all.

An owner is one process: (boot_id, pid, starttime) is its identity. The machine id only
says where it lives, for owners that another machine wrote onto what two machines share
(an engine, a filesystem): the boot id alone would read them as "this host rebooted".
Owners written before the machine id was (the 3-part `<boot_id>:<pid>:<starttime>`) are
judged as they always were.
"""

from __future__ import annotations

import functools
import os
import re
import signal
from dataclasses import dataclass, field

from exitwatch import procfs

# PID_MAX_LIMIT on 64-bit Linux.
PID_MAX = 4 * 1024 * 1024
MAX_OWNER_LEN = 128
_BOOT_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_DIGITS = re.compile(r"[0-9]{1,20}")
_MACHINE_ID = re.compile(r"[0-9a-f]{32}")
# Where the machine id is read, in order: systemd's, then D-Bus's (the same id where both
# exist; the second alone on hosts without systemd). machine-id(5).
MACHINE_ID_FILES = ("/etc/machine-id", "/var/lib/dbus/machine-id")


class OwnerError(ValueError):
    """A malformed owner string. Such an owner is never treated as dead."""


@dataclass(frozen=True, order=True)
class Owner:
    boot_id: str
    pid: int
    starttime: int
    # The machine it lives on ('' in the 3-part form). Not part of its identity: one boot
    # id is one kernel's life on one machine, so two owners of the same boot, pid and start
    # time are the same process, whether or not both say where it lives.
    machine: str = field(default="", compare=False)

    def __str__(self) -> str:
        where = f"{self.machine}:" if self.machine else ""
        return f"{where}{self.boot_id}:{self.pid}:{self.starttime}"

    @classmethod
    def parse(cls, text: str) -> Owner:
        if not isinstance(text, str):
            raise OwnerError(f"owner must be a string, not {type(text).__name__}")
        if len(text) > MAX_OWNER_LEN:
            raise OwnerError(f"owner is {len(text)} characters long, at most {MAX_OWNER_LEN}")
        parts = text.split(":")
        if len(parts) not in (3, 4):
            raise OwnerError(f"owner {text!r} is not <machine_id>:<boot_id>:<pid>:<starttime>")
        machine = parts.pop(0) if len(parts) == 4 else None
        boot, pid, start = parts
        if machine is not None and not _MACHINE_ID.fullmatch(machine):
            raise OwnerError(
                f"owner {text!r}: machine id {machine!r} is not 32 lowercase hex digits"
            )
        if not _BOOT_ID.fullmatch(boot):
            raise OwnerError(f"owner {text!r}: boot id {boot!r} is not a lowercase UUID")
        if not _DIGITS.fullmatch(pid) or not 0 < int(pid) <= PID_MAX:
            raise OwnerError(f"owner {text!r}: pid {pid!r} is not an integer in 1..{PID_MAX}")
        if not _DIGITS.fullmatch(start) or int(start) >= 2**64:
            raise OwnerError(f"owner {text!r}: start time {start!r} is not a 64-bit tick count")
        return cls(boot, int(pid), int(start), machine or "")


@functools.cache
def current_boot_id() -> str:
    return procfs.boot_id()


def read_machine_id(paths: tuple[str, ...] = MACHINE_ID_FILES) -> tuple[str, str]:
    """(this machine's id, the file it was read from), or ('', why there is none): the
    first of `paths` that holds one (32 lowercase hex digits). An empty file, or systemd's
    "uninitialized" of a first boot, holds none. Raises OSError where a file could not be
    read for a reason that says nothing of it (EMFILE, EIO): none is known yet."""
    tried = []
    for path in paths:
        try:
            with open(path, "rb") as f:
                text = f.read(64).decode("ascii", "replace").strip()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError) as err:
            tried.append(f"{path}: {err.strerror or err}")
            continue
        if _MACHINE_ID.fullmatch(text):
            return text, path
        tried.append(f"{path}: holds no machine id")
    return "", "; ".join(tried)


@functools.cache
def current_machine() -> tuple[str, str]:
    """read_machine_id() of this process, read once (an OSError is not kept: the next call
    reads again)."""
    return read_machine_id()


def current_machine_id() -> str:
    """This machine's id, '' when it has none (owners are written in the 3-part form)."""
    return current_machine()[0]


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
    starttime = procfs.read_stat(pid).starttime
    return Owner(current_boot_id(), pid, starttime, current_machine_id())


def pidfd(owner: Owner) -> int | None:
    """A pidfd of `owner` while it lives: a signal sent through it reaches that process and
    no other, and it turns readable once the process has exited. None when the owner is
    dead, or another machine's. Raises OSError when that cannot be told now (EMFILE)."""
    if elsewhere(owner) is not None:
        return None
    try:
        fd = os.pidfd_open(owner.pid)
    except ProcessLookupError:
        return None
    try:
        # Opened first, judged after: the process found alive is the one the fd holds (a pid
        # reused in between has another start time, and reads as the owner dead).
        if death(owner) is not None:
            os.close(fd)
            return None
    except BaseException:
        os.close(fd)
        raise
    return fd


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


def elsewhere(owner: Owner) -> str | None:
    """Why `owner` is not this machine's to judge (it lives on another), or None when it
    is: an owner of this boot (the boot id names this kernel's life, whatever machine id
    was read where it was written: by a process on the host's pids with a mount namespace
    and /etc/machine-id of its own, say), one that says this machine's id, and one of the
    3-part form, which says none."""
    if not owner.machine:
        return None
    here, where = current_machine()
    # This machine's own owners, nearly all, need no boot id read: an earlier boot's is dead.
    if owner.machine == here or owner.boot_id == current_boot_id():
        return None
    if not here:
        # Then this machine's own owners are written in the 3-part form: one that names a
        # machine was written elsewhere, or before this one lost its id. Not ours to judge.
        return f"of machine {owner.machine}; this machine has no machine id ({where})"
    return f"of machine {owner.machine}, not this one"


def death(owner: Owner) -> str | None:
    """Why the owner is dead, or None while it lives, or while it is not this machine's to
    judge (elsewhere() says so): either way, what it holds is left alone. Raises OSError
    when that cannot be read now (a full fd table), which proves nothing.

    Alive means: same boot, /proc/PID/stat present with the same start time, and not a
    zombie (or dead) with a single task left. Anything else is dead.
    """
    if elsewhere(owner) is not None:
        return None
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
