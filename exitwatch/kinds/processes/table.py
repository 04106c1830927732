"""The process table as the leftover-process kind sees it: which processes carry a run's
owner, and each run's uid, learnt while its wrapper lives.

Nothing announces a fork to the agent (its sources follow exits only), so the kind lists
/proc every leftovers_interval. A process's environment is read once per (pid, start
time, environment area): the area moves at every exec, where an environment can change.
That identity is read for every process at every FULL_EVERY-th rescan only; the others
read new pids alone. docs/design.md ("A run's leftover processes") has the figures.
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time

import psutil

from exitwatch import procfs
from exitwatch.contract import ENV_OWNER, ENV_RUN
from exitwatch.kinds.base import Resource
from exitwatch.owner import Owner, OwnerError, current_boot_id, death

log = logging.getLogger(__name__)

# Every FULL_EVERY-th rescan reads every process's identity again; the others read only new
# pids. A new process nearly always has a new pid, and one idle listing of /proc costs far
# less than a read per process (14 ms of CPU a second on a host of 1,000 processes). What a
# partial rescan can miss, an exec that adds the variables to a known pid or a pid reused
# within one interval, the next full one finds; a kill checks everything again anyway.
FULL_EVERY = 10
UID_GRACE = 60.0  # seconds a dead run's uid is kept once nothing carries its owner
PF_KTHREAD = 0x00200000
# A process whose environment or pid namespace the agent may not read (another's, without
# CAP_SYS_PTRACE): whether it carries an owner cannot be told. Kept in the table as such,
# read again at the next full rescan, and counted: the kind is blind to it.
DENIED = "denied"


class Table:
    """What is known of the processes on the host, and of the runs they belong to.

    Shared by the watching thread and the removal workers: entries are replaced whole,
    never changed in place, under one lock.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind  # of the resources it finds: the process kind's KIND
        self.lock = threading.Lock()
        # pid -> (procfs.identity, the Resource, None when not a run's, or DENIED)
        self.procs: dict[int, tuple[tuple, Resource | str | None]] = {}
        # The last denied read, for people: "process PID (comm): /proc/PID/environ: ..."
        self.last_denied: str | None = None
        # A run's uid, learnt while its wrapper lived; None: it could not be (not retried)
        self.uids: dict[Owner, int | None] = {}
        self.carried: dict[Owner, float] = {}  # when a process last carried the owner
        self.self_pid = os.getpid()
        self.pid_ns = procfs.namespace("self", "pid")

    def rescan(self, full: bool = True) -> dict[str, Resource]:
        """Every process carrying a well-formed owner now, by key. Unless `full`, a pid
        already known is taken to be the same exec of the same process without a read."""
        fresh: dict[int, tuple[tuple, Resource | str | None]] = {}
        found: dict[str, Resource] = {}
        with self.lock:
            old = self.procs
        for pid in psutil.pids():
            entry = old.get(pid)
            try:
                if entry is None or full:
                    sig = procfs.identity(pid)  # the one read most processes cost
                    # One it could not read is tried again at every full rescan.
                    if entry is None or entry[0] != sig or entry[1] is DENIED:
                        entry = (sig, self._read(procfs.read_stat(pid)))
            except OSError:  # ProcessLookupError included
                continue  # it just left
            fresh[pid] = entry
            if isinstance(entry[1], Resource):
                found[entry[1].key] = entry[1]
        with self.lock:  # scan() may rescan on another thread meanwhile
            unknown = {res.owner for res in found.values()} - self.uids.keys()
        for owner in unknown:
            self._learn(owner)
        now = time.monotonic()
        with self.lock:
            self.procs = fresh
            for res in found.values():
                self.carried[res.owner] = now
            # A dead run's uid outlives its last carrier by UID_GRACE: a leftover may still
            # appear (a fork under way, a descendant's exec), and must meet the same uid.
            for owner, last in list(self.carried.items()):
                if now - last > UID_GRACE and death(owner) is not None:
                    del self.carried[owner]
                    self.uids.pop(owner, None)
        return found

    def _read(self, stat: procfs.Stat) -> Resource | str | None:
        """The Resource of a process that carries an owner, None, or DENIED when whether it
        does cannot be read."""
        # Never killed (Processes._check refuses them), so never read: pid 1 among them,
        # which may hold capabilities the agent lacks and then cannot be read at all.
        if stat.flags & PF_KTHREAD or stat.state in ("Z", "X") or stat.pid in (1, self.self_pid):
            return None
        # A container's is the container kind's; a stat costs less than the environment.
        try:
            if procfs.namespace(stat.pid, "pid") != self.pid_ns:
                return None
            environ = psutil.Process(stat.pid).environ()
        except (PermissionError, psutil.AccessDenied) as err:
            return self._denied(stat, err)
        except psutil.Error:
            return None  # gone, or a zombie by now
        value = environ.get(ENV_OWNER)
        if value is None or environ.get(ENV_RUN) != value:
            return None  # no run's: a shell that exported the owner for compose, say
        try:
            owner = Owner.parse(value)
        except OwnerError as err:
            log.debug("process %d: %s=%r: %s; ignored", stat.pid, ENV_OWNER, value, err)
            return None
        key = f"{stat.pid}:{stat.starttime}"
        return Resource(self.kind, key, owner, name=f"process {stat.pid} ({stat.comm})")

    def _denied(self, stat: procfs.Stat, err: Exception) -> str:
        what = f"process {stat.pid} ({stat.comm}): {err}"
        with self.lock:
            first, self.last_denied = self.last_denied is None, what
        if first:  # once per table: the next ones are counted, in health() and the metric
            log.warning(
                "leftover processes: cannot read whether %s carries a run's owner; this kind "
                "is blind to such processes: give the agent CAP_SYS_PTRACE (the packaged "
                "unit's CapabilityBoundingSet= has it)",
                what,
            )
        return DENIED

    def denied(self) -> int:
        """How many processes the last rescan could not read."""
        with self.lock:
            return sum(1 for _, res in self.procs.values() if res is DENIED)

    def _learn(self, owner: Owner) -> None:
        """Record the uid of a live run's wrapper, or None when it cannot be had (dead,
        never seen alive, setuid), which is not tried again: once per owner, not per
        process nor per rescan. Only a failure to look at all is retried.

        Any live process named by a carrier of both variables passes for a wrapper: those
        are a run's descendants, or processes that set EXITWATCH_RUN by hand, and the
        latter can only name an owner of their own uid to have themselves killed."""
        try:
            uid = _wrapper_uid(owner)
        except OSError as err:
            log.debug("the uid of run %s: %s; tried again at the next rescan", owner, err)
            return
        with self.lock:
            self.uids[owner] = uid

    def uid(self, owner: Owner) -> int | None:
        with self.lock:
            return self.uids.get(owner)


def _wrapper_uid(owner: Owner) -> int | None:
    """The uid of the live wrapper `owner`, or None when it is dead or setuid (not anyone's
    run). Its pid is pinned by a pidfd while its /proc entries are read, so the uid read is
    the wrapper's, not a successor's. OSError: it could not be looked at (e.g. EMFILE)."""
    if owner.boot_id != current_boot_id():
        return None
    try:
        pidfd = os.pidfd_open(owner.pid)
    except ProcessLookupError:
        return None  # dead: never seen alive, its uid stays unknown
    try:
        if procfs.read_stat(owner.pid).starttime != owner.starttime:
            return None
        uids = psutil.Process(owner.pid).uids()
        if exited(pidfd, 0):
            return None
    except (ProcessLookupError, psutil.Error):
        return None
    finally:
        os.close(pidfd)
    return uids.real if len(set(uids)) == 1 else None


def exited(pidfd: int, timeout: float) -> bool:
    """Whether the pidfd's process has exited, waiting up to `timeout` seconds."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(timeout * 1000))
