"""Leases: directories in a spool, each holding a command that the agent runs as the
directory's owner every so often, for as long as the lease's owner lives. "Removing" one (its
owner is dead) is forgetting it, so that it never runs again, and deleting its directory.

A lease runs with a hook's rules (kinds/hooks): as its user, with a minimal environment,
in a process group of its own killed at its timeout; on workers of its own, PER_UID of one
user at once, so that no user's leases delay another's. Each run holds a pidfd of the
owner: the run is killed the moment the owner exits, and none starts once it has.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import pwd
import shlex
import threading
import time
from collections.abc import KeysView
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypedDict

from exitwatch import owner as owners
from exitwatch.alive import ENV_LEASE_OWNER, LEASE_FILE, lease_problem
from exitwatch.kinds.base import Outcome, Resource
from exitwatch.kinds.spool import spawn
from exitwatch.kinds.spool.entry import (
    Entry,
    EntryError,
    Format,
    check_again,
    read_entry,
    spool_fd,
)
from exitwatch.kinds.spool.listing import Warnings
from exitwatch.kinds.spool.timed import TimedSpoolKind
from exitwatch.owner import Owner

log = logging.getLogger(__name__)

KIND = "lease"
PER_UID = 8  # runs of one user's leases at once; the rest wait their turn, holding no worker
# Runs at once, over all users: as for hooks, it takes JOBS / PER_UID users each filling
# their lane with runs that hang to keep another user's lease waiting for a worker (a
# thread, made only when a run needs one).
JOBS = 256
# A lease that keeps failing says so once, then once per FAILING_LOG_EVERY, not at each run.
FAILING_LOG_EVERY = 300.0

FORMAT = Format(
    "lease",
    LEASE_FILE,
    lease_problem,
    show=lambda name, body: f"{name}: every {body['every']:g} s: {shlex.join(body['argv'])}",
    unusable="no lease runs",
    keep=lambda body: (float(body["every"]),),
)


class LeasesHealth(TypedDict):
    """The status document's `leases` entry."""

    leases: int  # followed now: their owners live
    running: int  # runs under way
    runs: int  # since start, each run
    failures: int  # runs that failed to start, exited non-zero or timed out
    failing: int  # leases whose last run failed
    last_failure: str | None
    unreadable: int  # runs not started: whether the owner lives could not be read


@dataclass
class _Lease:
    entry: Entry
    due: float  # monotonic
    running: bool = False
    waiting: bool = False  # in its user's queue
    failing: bool = False
    blind: bool = False  # its last run was not made: whether its owner lives could not be read
    logged: float = float("-inf")  # when its failing (or blindness) was last said


class Leases(TimedSpoolKind):
    """The leases in one spool directory, and their runs."""

    kind = KIND
    fmt = FORMAT

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self._leases: dict[str, _Lease] = {}
        self._per_uid: collections.Counter[int] = collections.Counter()
        self._queued: dict[int, collections.deque[str]] = collections.defaultdict(collections.deque)
        self._totals: collections.Counter[str] = collections.Counter()
        self._last_failure: str | None = None
        self._failures = Warnings(FORMAT.noun, "failing")
        # Readable once the agent stops: the runs under way are killed with it.
        self._stop_r, self._stop_w = os.pipe2(os.O_CLOEXEC)
        self._pool = ThreadPoolExecutor(JOBS, thread_name_prefix="exitwatch-lease-run")

    # -- following: the leases the discovery tells of, and the schedule ---------------------

    def _followed(self) -> KeysView[str]:
        return self._leases.keys()

    def _went(self, key: str) -> None:
        self._leases.pop(key, None)

    def _due_at(self, key: str) -> float | None:
        lease = self._leases.get(key)
        return None if lease is None else lease.due

    def _act(self, key: str, now: float) -> None:
        self._due(self._leases[key], now)

    def _seen(self, entry: Entry) -> None:
        """A lease seen (again): a new or changed one runs at once, then on its interval."""
        old = self._leases.get(entry.key)
        if old is not None and old.entry == entry:
            return
        now = time.monotonic()
        lease = _Lease(entry, now)
        if old is not None:  # changed: no run of it twice at once all the same
            lease.running, lease.waiting = old.running, old.waiting
        self._leases[entry.key] = lease
        self._at(entry.key, now)

    def stop(self) -> None:
        super().stop()
        if not self._halt():  # stopped already: its pipe may be closed, its fds reused
            return
        with contextlib.suppress(OSError):
            os.write(self._stop_w, b"x")  # the runs under way are killed
        self._join()
        # Their workers end within moments; the stop pipe goes after them, off this thread
        # (the agent's stop has a deadline).
        threading.Thread(target=self._close, name="exitwatch-leases-close", daemon=True).start()

    def _close(self) -> None:
        self._pool.shutdown(wait=True)
        os.close(self._stop_r)
        os.close(self._stop_w)

    def _due(self, lease: _Lease, now: float) -> None:
        """Its time has come: it runs now, or once its user has a run to spare. The next
        run is due `every` after this one was: a run that takes longer skips the runs it
        overlaps, never runs twice at once."""
        lease.due = now + lease.entry.detail[0]
        self._at(lease.entry.key, lease.due)
        if lease.running or lease.waiting:
            return
        uid = lease.entry.uid
        if self._per_uid[uid] >= PER_UID:
            lease.waiting = True
            self._queued[uid].append(lease.entry.key)
            return
        self._begin(lease)

    def _begin(self, lease: _Lease) -> None:
        if self._stopping:  # the pool is shut: nothing starts after the agent's stop
            return
        lease.running, lease.waiting = True, False
        self._per_uid[lease.entry.uid] += 1
        self._pool.submit(self._run, lease.entry)

    def _ended(self, entry: Entry, result: tuple[str, str] | None) -> None:
        """A run of `entry` ended: `result` is (what, why) of a failure, else None."""
        with self._cond:
            uid = entry.uid
            self._per_uid[uid] -= 1
            if not self._per_uid[uid]:
                del self._per_uid[uid]
            lease = self._leases.get(entry.key)
            if lease is not None:
                lease.running = False
                self._said(lease, result)
            queue = self._queued.get(uid)
            while queue and self._per_uid[uid] < PER_UID:
                waiting = self._leases.get(queue.popleft())
                if waiting is not None and waiting.waiting and not waiting.running:
                    self._begin(waiting)
            if queue is not None and not queue:
                del self._queued[uid]

    def _said(self, lease: _Lease, result: tuple[str, str] | None) -> None:
        """Say a lease's failing (or its owner unreadable) once as it starts, then every
        FAILING_LOG_EVERY; and when it works again."""
        what = self.what(lease.entry)
        if result is None:
            if lease.failing or lease.blind:
                log.info("%s: runs again", what)
            lease.failing = lease.blind = False
            return
        blind = result[0] == "unreadable"
        now = time.monotonic()
        streak = lease.blind if blind else lease.failing
        if not streak or now - lease.logged >= FAILING_LOG_EVERY:
            # Within a bound per user: one user's thousand failing leases, or a new one made
            # at every moment, write a few lines a minute, then one that counts the rest.
            text = f"{what}: {result[1]}" + ("; it does not run" if blind else "")
            self._failures.warn(lease.entry.uid, text)
            self._failures.flush()
            lease.logged = now
        if blind:
            lease.blind = True
        else:
            lease.failing = True

    # -- one run -----------------------------------------------------------------------------

    def _run(self, entry: Entry) -> None:
        result: tuple[str, str] | None = None
        try:
            result = self._run_one(entry)
        except Exception as err:  # one run's surprise must not stop the lease
            result = ("failures", f"cannot run: {type(err).__name__}: {err}")
        finally:
            if result is not None:
                key, why = result
                with self._cond:
                    self._totals[key] += 1
                    self._totals["runs"] += key in ("ok", "failures", "stopped")
                    if key == "failures":
                        self._last_failure = f"{self.what(entry)}: {why}"
            told = result if result and result[0] in ("failures", "unreadable") else None
            self._ended(entry, told)

    def _run_one(self, entry: Entry) -> tuple[str, str] | None:
        """Run the lease once, if its owner lives: (how it went, why), "ok", "failures",
        "stopped" (its owner died, or the agent stops) or "unreadable" (none made: whether
        its owner lives could not be told); None when none was made (its owner is dead,
        the lease went, or is another user's now)."""
        try:
            pidfd = owners.pidfd(entry.owner)
        except OSError as err:  # proves nothing: the next run tries again
            return ("unreadable", f"cannot tell whether its owner lives: {err.strerror}")
        if pidfd is None:
            return None  # dead: the agent removes it
        try:
            return self._run_opened(entry, pidfd)
        finally:
            os.close(pidfd)

    def _run_opened(self, entry: Entry, pidfd: int) -> tuple[str, str] | None:
        dir_fd = spool_fd(self.path)
        try:
            try:
                opened = read_entry(FORMAT, KIND, dir_fd, entry.key)
            except FileNotFoundError:
                return None  # cancelled
            except EntryError as err:
                return ("failures", f"refused: {err}")
            try:
                if opened.entry.uid != entry.uid:
                    return None  # another user's now (this one's went): a lease of its own
                if opened.entry.owner != entry.owner:
                    why = f"its file now names owner {opened.entry.owner}, not {entry.owner}"
                    return ("failures", f"refused: {why}: add a lease for that owner instead")
                check_again(FORMAT, opened, dir_fd)
                if opened.entry != entry:
                    self._replaced(entry, opened.entry)
                user = pwd.getpwuid(entry.uid)
                env = spawn.environment(user, opened.body["env"])
                env[ENV_LEASE_OWNER] = str(entry.owner)
                body = opened.body
                stops = (pidfd, self._stop_r)
                ran = spawn.run_as(user, body["argv"], env, body["cwd"], body["timeout"], stops)
            finally:
                opened.close()
        except EntryError as err:
            return ("failures", f"refused: {err}")
        except (KeyError, OSError) as err:
            why = err.strerror if isinstance(err, OSError) else "its user vanished"
            return ("failures", f"cannot run: {why}")
        finally:
            os.close(dir_fd)
        if ran.ok:
            return ("ok", "")
        if ran.stopped:  # its owner died, or the agent stops: not the lease's failure
            return ("stopped", ran.describe())
        return ("failures", f"failed: {ran.describe()}; output: {ran.tail[-200:]!r}")

    def _replaced(self, old: Entry, new: Entry) -> None:
        """The lease's file was replaced by its user (a rename over it, which raises no
        event in the spool), for the same owner: the new one runs from now on, at its own
        interval. Skipping it until the next whole listing would stop the lease, unsaid."""
        with self._cond:
            lease = self._leases.get(old.key)
            if lease is not None and lease.entry == old:
                lease.entry = new

    # -- removal: the owner is dead ----------------------------------------------------------

    def remove(
        self, owner: Owner, resources: list[Resource], dry_run: bool, how: str
    ) -> list[Outcome]:
        """Forget the dead owner's leases (no run starts again; one under way was killed as
        its owner exited) and delete them."""
        if not dry_run:
            with self._cond:
                for res in resources:
                    self._leases.pop(res.key, None)
        return self.delete(resources, dry_run, "removed; it runs no more")

    def health(self) -> LeasesHealth:
        with self._cond:
            return {
                "leases": len(self._leases),
                "running": sum(self._per_uid.values()),
                "runs": self._totals["runs"],
                "failures": self._totals["failures"],
                "failing": sum(lease.failing for lease in self._leases.values()),
                "last_failure": self._last_failure,
                "unreadable": self._totals["unreadable"],
            }
