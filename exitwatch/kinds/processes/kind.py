"""Processes: what an `exitwatch run` left running when its wrapper died.

`exitwatch run` puts EXITWATCH_OWNER=<the wrapper's owner> and EXITWATCH_RUN=<the same>
into its command's environment, and every descendant inherits them, those that called
setsid included. When the wrapper is SIGKILLed its command dies with it (parent-death
signal), but a descendant in a session of its own lives on: the agent ends those whose
environment carries the dead owner in both.

EXITWATCH_OWNER alone is not enough: `exitwatch labels --format env` exports it into
ordinary shells so that compose files can label with it, and what such a shell started
(nohup jobs, tmux, daemons) must outlive it. Only the wrapper sets EXITWATCH_RUN; a
process that sets it by hand can only have its own uid's processes killed (see below).

Discovery: nothing announces a fork to the agent (its sources follow exits only), so a
thread lists /proc every leftovers_interval (config). Each process's environment is read once per
(pid, start time, environment area): the area moves at every exec, which is where an
environment can change (a fork copies it whole), so a process seen between its fork and
an exec that adds the variable is read again. That identity (one raw read of
/proc/PID/stat, procfs.identity) is read for every process at every FULL_EVERY-th rescan
only; the others read new pids alone, so that idle a rescan costs little more than one
/proc listing. A run's wrapper is looked at once, not per process nor per rescan
(bench/rescan.py measures a rescan; README has the figures). A run whose
leftovers appear after its death is still found at the next rescan: its owner is dead,
so they go at once (its uid is kept UID_GRACE past its last carrier). Only the host's pid
namespace is looked at: a container's processes are the container kind's.

The run's uid: a leftover may die only if all of its uids are the run's, so that a
process that inherited the variable through sudo or a setuid program, or one of another
user's who set it by hand, is never touched (the latter may only name their own run or
another user's: with their own uid they can only have their own processes killed). The
wrapper is dead by the time anything is removed, so its uid is learnt while it lives,
when the first process carrying its owner is seen. If it was never seen alive (the agent
started after the run died, or the run lived less than one rescan) the uid is unknown
and its processes are refused, audited, rather than guessed from the processes
themselves: any of them could be one that changed uid. Never killed either: pid 1, kernel
threads, the agent and its descendants (a hook it runs may carry the variable).

SIGKILL, straight away: the run was already SIGKILLed (its command by the parent-death
signal), and its containers are removed by force at the same moment; a leftover's own
SIGTERM cleanup would run against vanishing resources and could start new processes
carrying the variable. So the verdict is the same as for the rest of the run, with no
grace to wait out on a removal worker. (The wrapper itself, alive, grants SIGTERM and a
grace to its descendants.)

psutil reads the environment and the uids and maps its errors; identity is the exact
start time from procfs (psutil's create_time() is wall-clock seconds, which move when
the clock is stepped), and signals go through a pidfd, which psutil does not offer: a pid
may be reused between the checks and the kill, a pidfd may not.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
import select
import signal
import threading
import time

import psutil

from exitwatch import procfs
from exitwatch.contract import ENV_OWNER, ENV_RUN
from exitwatch.kinds import discovery
from exitwatch.kinds.base import (
    Found,
    Gone,
    Notify,
    Outcome,
    Resource,
    ResourceKind,
    Snapshot,
)
from exitwatch.owner import Owner, OwnerError, current_boot_id, death

log = logging.getLogger(__name__)

KIND = "process"
RESCAN_INTERVAL = 1.0  # seconds between two listings of /proc by the watching thread
# Every FULL_EVERY-th rescan reads every process's identity again; the others read only new
# pids. A new process nearly always has a new pid, and one idle listing of /proc costs far
# less than a read per process (14 ms of CPU a second on a host of 1,000 processes). What a
# partial rescan can miss, an exec that adds the variables to a known pid or a pid reused
# within one interval, the next full one finds; a kill checks everything again anyway.
FULL_EVERY = 10
UID_GRACE = 60.0  # seconds a dead run's uid is kept once nothing carries its owner
EXIT_WAIT = 1.0  # how long a removal waits for a killed process to be gone
MAX_BACKOFF = 60.0  # the longest wait before another try of a failing rescan
PF_KTHREAD = 0x00200000


class _Refused(Exception):
    """A safety check leaves the process alone; the message says why."""


class _Seen:
    """What is known of the processes on the host, and of the runs they belong to.

    Shared by the watching thread and the removal workers: entries are replaced whole,
    never changed in place, under one lock.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        # pid -> (procfs.identity, the Resource or None when not a run's)
        self.procs: dict[int, tuple[tuple, Resource | None]] = {}
        # A run's uid, learnt while its wrapper lived; None: it could not be (not retried)
        self.uids: dict[Owner, int | None] = {}
        self.carried: dict[Owner, float] = {}  # when a process last carried the owner
        self.self_pid = os.getpid()
        self.pid_ns = procfs.namespace("self", "pid")

    def rescan(self, full: bool = True) -> dict[str, Resource]:
        """Every process carrying a well-formed owner now, by key. Unless `full`, a pid
        already known is taken to be the same exec of the same process without a read."""
        fresh: dict[int, tuple[tuple, Resource | None]] = {}
        found: dict[str, Resource] = {}
        with self.lock:
            old = self.procs
        for pid in psutil.pids():
            entry = old.get(pid)
            try:
                if entry is None or full:
                    sig = procfs.identity(pid)  # the one read most processes cost
                    if entry is None or entry[0] != sig:
                        entry = (sig, self._read(procfs.read_stat(pid)))
            except OSError:  # ProcessLookupError included
                continue  # it just left
            fresh[pid] = entry
            if entry[1] is not None:
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

    def _read(self, stat: procfs.Stat) -> Resource | None:
        """The Resource of a process that carries an owner, or None."""
        if stat.flags & PF_KTHREAD or stat.state in ("Z", "X") or stat.pid == self.self_pid:
            return None
        # A container's is the container kind's; a stat costs less than the environment.
        if procfs.namespace(stat.pid, "pid") != self.pid_ns:
            return None
        try:
            environ = psutil.Process(stat.pid).environ()
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
        return Resource(KIND, key, owner, name=f"process {stat.pid} ({stat.comm})")

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
        if _exited(pidfd, 0):
            return None
    except (ProcessLookupError, psutil.Error):
        return None
    finally:
        os.close(pidfd)
    return uids.real if len(set(uids)) == 1 else None


def _exited(pidfd: int, timeout: float) -> bool:
    """Whether the pidfd's process has exited, waiting up to `timeout` seconds."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(timeout * 1000))


class Processes(ResourceKind):
    kind = KIND

    def __init__(self, interval: float = RESCAN_INTERVAL) -> None:
        self.interval = interval
        self._seen = _Seen()
        self._discovery = discovery.Discovery("process discovery", "exitwatch-processes")
        self._lock = threading.Lock()  # the counters below, read by status
        self._rescans = self._failures = self._failing = 0
        self._last_error: str | None = None

    # Discovery

    def scan(self) -> Snapshot:
        found = self._seen.rescan()
        return Snapshot(KIND, tuple(found[k] for k in sorted(found)))

    def start(self, notify: Notify) -> None:
        self._discovery.start(lambda stop_fd: self._follow(notify, stop_fd))

    def _follow(self, notify: Notify, stop_fd: int) -> None:
        # A Snapshot first, then only changes: a refused leftover is reported (and its
        # refusal audited) once, not at every rescan. A rescan that fails is tried again,
        # later each time (up to MAX_BACKOFF), and shown in health(); the first of a run
        # of failures is logged whole, the rest in a line each.
        before: dict[str, Resource] | None = None
        wait = 0.0
        rescans = 0
        while not discovery.wait(stop_fd, None, wait):
            try:
                now = self._seen.rescan(full=rescans % FULL_EVERY == 0)
                rescans += 1
                if before is None:
                    notify(Snapshot(KIND, tuple(now.values())))
                else:
                    for key in before.keys() - now.keys():
                        notify(Gone(KIND, key))
                    for key in now.keys() - before.keys():
                        notify(Found(now[key]))
                before = now
            except Exception as err:
                with self._lock:
                    self._failures += 1
                    self._failing += 1
                    self._last_error = f"{type(err).__name__}: {err}"
                    failing = self._failing
                wait = min(self.interval * 2**failing, MAX_BACKOFF)
                if failing == 1:
                    log.exception("leftover processes: a rescan failed; again in %.0f s", wait)
                else:
                    log.warning(
                        "leftover processes: rescan failed %d times in a row: %s; again in %.0f s",
                        failing,
                        err,
                        wait,
                    )
                continue
            with self._lock:
                self._rescans += 1
                self._failing = 0
            wait = self.interval

    def health(self) -> dict:
        with self._lock:
            return {
                "interval_s": self.interval,
                "rescans": self._rescans,
                "failures": self._failures,
                "failing": self._failing,  # failures in a row now; 0: it works
                "last_error": self._last_error,
            }

    def stop(self) -> None:
        self._discovery.stop()

    # Removal

    def what(self, res: Resource) -> str:
        return res.name  # "process PID (comm)"

    def remove(
        self, owner: Owner, resources: list[Resource], dry_run: bool, how: str
    ) -> list[Outcome]:
        uid = self._seen.uid(owner)
        # Every SIGKILL is sent first, then all are waited for at once: a run's leftovers
        # die together, in one EXIT_WAIT at most rather than one each.
        outcomes: list[Outcome | None] = []
        sent: list[tuple[int, Resource, int]] = []  # (index in outcomes, resource, pidfd)
        try:
            for res in resources:
                outcome, pidfd = self._kill(owner, uid, res, dry_run)
                if pidfd is not None:
                    sent.append((len(outcomes), res, pidfd))
                outcomes.append(outcome)
            deadline = time.monotonic() + EXIT_WAIT
            for index, res, pidfd in sent:
                if _exited(pidfd, max(0.0, deadline - time.monotonic())):
                    outcomes[index] = Outcome.done(res.name, KIND, "killed (SIGKILL)")
                else:
                    why = f"SIGKILL sent, still running after {EXIT_WAIT:g} s"
                    outcomes[index] = Outcome.failed(res.name, KIND, why)
        finally:
            for _, _, pidfd in sent:
                os.close(pidfd)
        # Each names its process, so that only the ones that failed are retried.
        return [
            dataclasses.replace(o, key=r.key)
            for o, r in zip(outcomes, resources, strict=True)
            if o is not None
        ]

    def _kill(
        self, owner: Owner, uid: int | None, res: Resource, dry_run: bool
    ) -> tuple[Outcome | None, int | None]:
        """Check the process and SIGKILL it: (None, its pidfd, open) once the signal is
        sent, for the caller to wait on; else (the outcome, None)."""
        pid, starttime = map(int, res.key.split(":"))
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            return Outcome.done(res.name, KIND, "already gone"), None
        except OSError as err:
            return Outcome.failed(res.name, KIND, f"failed: {err.strerror}"), None
        try:
            try:
                self._check(owner, uid, pid, starttime)
            except _Refused as why:
                log.warning("%s: refused to kill: %s", res.name, why)
                outcome = Outcome.refusal(res.name, KIND, str(why))
                return outcome, None
            except (ProcessLookupError, psutil.NoSuchProcess, psutil.ZombieProcess):
                return Outcome.done(res.name, KIND, "already gone"), None
            except psutil.Error as err:  # AccessDenied: not root, or a hardened /proc
                return Outcome.failed(res.name, KIND, f"failed: {err}"), None
            # Still running after the checks: every /proc read above was of this pidfd's
            # process, and the signal below can reach no other.
            if _exited(pidfd, 0):
                return Outcome.done(res.name, KIND, "already gone"), None
            if dry_run:
                return Outcome.done(res.name, KIND, "would kill"), None
            try:
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            except ProcessLookupError:
                return Outcome.done(res.name, KIND, "already gone"), None
            kept, pidfd = pidfd, None
            return None, kept
        except OSError as err:
            detail = f"failed: {err.strerror or err}"
            return Outcome.failed(res.name, KIND, detail), None
        finally:
            if pidfd is not None:
                os.close(pidfd)

    def _check(self, owner: Owner, uid: int | None, pid: int, starttime: int) -> None:
        """Raise _Refused unless the process may die for `owner`; ProcessLookupError (or
        psutil's) when it is gone, its pid taken by another process."""
        stat = procfs.read_stat(pid)
        if stat.starttime != starttime:
            raise ProcessLookupError(pid)
        if pid in (1, self._seen.self_pid) or stat.flags & PF_KTHREAD:
            raise _Refused("it is pid 1, a kernel thread or the agent itself")
        if procfs.namespace(pid, "pid") != self._seen.pid_ns:
            raise _Refused("it is in another pid namespace")
        proc = psutil.Process(pid)
        environ = proc.environ()
        if not environ:
            # Read between an exec's new memory map and its new environment, /proc shows
            # none. That says nothing yet: a failure, retried, rather than a refusal.
            raise OSError(errno.EAGAIN, "its environment reads empty now (an exec under way?)")
        if environ.get(ENV_OWNER) != str(owner) or environ.get(ENV_RUN) != str(owner):
            raise _Refused(f"its environment no longer carries {ENV_OWNER} and {ENV_RUN}={owner}")
        if uid is None:
            raise _Refused(
                "the run's uid is unknown (its wrapper was never seen alive), so whose "
                "process this is cannot be told"
            )
        uids = proc.uids()
        if set(uids) != {uid}:
            raise _Refused(f"its uids {tuple(uids)} are not the run's uid {uid}")
        ancestor = stat.ppid
        while ancestor > 1:
            if ancestor == self._seen.self_pid:
                raise _Refused("it is the agent's own descendant")
            try:
                ancestor = procfs.read_stat(ancestor).ppid
            except ProcessLookupError:
                break  # the chain changed under the walk: it no longer leads to the agent
