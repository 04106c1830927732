"""Processes: what an `exitwatch run` left running when its wrapper died, carrying the dead
owner in both EXITWATCH_OWNER and EXITWATCH_RUN. table.py finds them; this kind kills
them (SIGKILL, through a pidfd, after checking again whose they are). docs/design.md ("A
run's leftover processes") gives the reasons: which processes may die, whose uid, and
why SIGKILL straight away.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
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
from exitwatch.kinds.processes.table import FULL_EVERY, PF_KTHREAD, Table, exited
from exitwatch.owner import Owner

log = logging.getLogger(__name__)

KIND = "process"

RESCAN_INTERVAL = 1.0  # seconds between two listings of /proc by the watching thread
EXIT_WAIT = 1.0  # how long a removal waits for a killed process to be gone
MAX_BACKOFF = 60.0  # the longest wait before another try of a failing rescan


class _Refused(Exception):
    """A safety check leaves the process alone; the message says why."""


class Processes(ResourceKind):
    kind = KIND

    def __init__(self, interval: float = RESCAN_INTERVAL) -> None:
        self.interval = interval
        self._seen = Table(KIND)
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
                if failing == 1 and isinstance(err, OSError):  # /proc cannot be read now
                    log.warning(
                        "leftover processes: a rescan failed: %s; again in %.0f s", err, wait
                    )
                elif failing == 1:  # a bug: said with its traceback
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

    def overdue(self, res: Resource) -> bool:
        """A rescan reads a new pid's environment within an interval, and one that took
        the variables by exec within a full rescan (FULL_EVERY intervals): a process
        younger than that, which a reconcile lists first, was not missed."""
        starttime = int(res.key.rsplit(":", 1)[1])  # the key is "PID:STARTTIME"
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - starttime / os.sysconf("SC_CLK_TCK")
        return age > (FULL_EVERY + 1) * self.interval

    def health(self) -> dict:
        with self._lock:
            return {
                "interval_s": self.interval,
                "rescans": self._rescans,
                "failures": self._failures,
                "failing": self._failing,  # failures in a row now; 0: it works
                "last_error": self._last_error,
                # Processes whose owner could not be read at the last rescan (no
                # CAP_SYS_PTRACE): what this kind cannot see. 0: it sees everything.
                "unreadable": self._seen.denied(),
                "last_unreadable": self._seen.last_denied,
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
                if exited(pidfd, max(0.0, deadline - time.monotonic())):
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
            if exited(pidfd, 0):
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
