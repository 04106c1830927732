"""On-death hooks: directories in a spool, each holding a file that names an owner and a
command. "Removing" one is running its command as the directory's owner, and deleting it
once it succeeded.

A hook runs as whoever owns its directory (and its file), and at least once: it goes only
after its command succeeded. docs/design.md ("On-death hooks") gives the spool's rules and
why.
"""

from __future__ import annotations

import fcntl
import logging
import os
import pwd
from collections.abc import Hashable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from exitwatch.contract import HOOK_FILE, HOOK_MAX_TIMEOUT, hook_problem
from exitwatch.kinds.base import Outcome, Resource
from exitwatch.kinds.fsops import printable
from exitwatch.kinds.spool import spawn
from exitwatch.kinds.spool.entry import (
    Entry,
    EntryError,
    Format,
    Opened,
    check_again,
    read_entry,
    remove_entry,
    spool_fd,
)
from exitwatch.kinds.spool.kind import SpoolKind
from exitwatch.owner import Owner

log = logging.getLogger(__name__)

KIND = "hook"

# Hooks run on workers of their own, never the agent's removal pool: a hook may run for
# up to its timeout, and hung ones must not hold up the removal of containers and workdirs.
# Hooks of one user run at once, whatever their owners: the agent's lane of a hook is its
# user, and a hook whose user has PER_UID running waits in the agent's queue, holding no
# worker, so one user's hooks can hold at most PER_UID of the JOBS workers.
PER_UID = 8
# Hooks run at once, over all users: far above PER_UID, so that it takes JOBS / PER_UID
# users each filling their lane to keep another user's hook waiting. A worker is a thread
# waiting on its hook's process, made only when a hook runs.
JOBS = 256
# How long a hook's lock may be held by someone else before that counts as a failed
# attempt: another exitwatch process runs a hook for up to its timeout.
LOCK_WAIT = HOOK_MAX_TIMEOUT + 60.0


FORMAT = Format("hook", HOOK_FILE, hook_problem, unusable="no hook runs")


class Hooks(SpoolKind):
    """The hooks in one spool directory."""

    kind = KIND
    fmt = FORMAT
    ages_pending = False  # a hook may rightly run for up to an hour
    lane_limit = PER_UID
    busy_wait = LOCK_WAIT

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.executor = ThreadPoolExecutor(JOBS, thread_name_prefix="exitwatch-hook-run")

    def lane(self, res: Resource) -> Hashable:
        return res.uid if isinstance(res, Entry) else None

    # Running ("removal")

    def remove(
        self, owner: Owner, resources: list[Resource], dry_run: bool, how: str
    ) -> list[Outcome]:
        """Run the hooks, one after another: the agent hands over one per job (a lane of
        its user), so that hooks run side by side on its workers, PER_UID of a user."""
        try:
            dir_fd = spool_fd(self.path)
        except (OSError, EntryError) as err:
            why = f"failed: spool {printable(self.path)}: {getattr(err, 'strerror', None) or err}"
            return [Outcome.failed(self.what(r), KIND, why, key=r.key) for r in resources]
        try:
            return [self._one(dir_fd, owner, res, dry_run, how) for res in resources]
        finally:
            os.close(dir_fd)

    def _one(self, dir_fd: int, owner: Owner, res: Resource, dry_run: bool, how: str) -> Outcome:
        # Each says which hook it is about, so that only the hooks that failed are retried.
        try:
            outcome = self._run_one(dir_fd, owner, res, dry_run, how)
        except Exception as err:  # one hook's surprise must not cost the others theirs
            log.error("%s: cannot run: %s: %s", self.what(res), type(err).__name__, err)
            why = f"failed: {type(err).__name__}: {err}"
            outcome = Outcome.failed(self.what(res), KIND, why, counts=("hook_failures",))
        return replace(outcome, key=res.key)

    def _run_one(
        self, dir_fd: int, owner: Owner, res: Resource, dry_run: bool, how: str
    ) -> Outcome:
        what = self.what(res)
        try:
            opened = read_entry(self.fmt, KIND, dir_fd, res.key)
        except FileNotFoundError:
            return Outcome.done(what, KIND, "already gone (ran, or was cancelled)")
        except EntryError as err:
            log.warning("%s: refused: %s", what, err)
            return Outcome.refusal(what, KIND, str(err))
        try:
            return self._run_opened(dir_fd, owner, res, opened, dry_run, how)
        finally:
            opened.close()  # and with it the lock, once the hook is gone (or kept for a retry)

    def _run_opened(
        self, dir_fd: int, owner: Owner, res: Resource, opened: Opened, dry_run: bool, how: str
    ) -> Outcome:
        what, hook, body = self.what(res), opened.entry, opened.body
        found = (getattr(res, "dev", 0), getattr(res, "ino", 0), getattr(res, "uid", -1))
        if (hook.dev, hook.ino, hook.uid) != found or getattr(res, "dir_ino", 0) != hook.dir_ino:
            return _refuse(what, "it was replaced since it was found")
        if hook.owner != owner:
            return _refuse(what, f"it now names owner {hook.owner}, not {owner}")
        if dry_run:
            return Outcome.done(what, KIND, "would run")
        try:
            user = pwd.getpwuid(hook.uid)
            env = spawn.environment(user, body["env"])
            env |= {"EXITWATCH_DEAD_OWNER": str(owner), "EXITWATCH_DEATH": how}
            # `exitwatch reap` beside the agent (or the agent before a reload): whoever
            # locks the file runs it. The other does not wait for the lock on a worker
            # (its user can hold it too): it looks again later, and then finds it gone, or
            # (failed) runs it itself. The lock goes with the descriptor.
            try:
                fcntl.flock(opened.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return Outcome.later(what, KIND, "another process holds its lock")
            if os.fstat(opened.fd).st_nlink == 0:  # the other ran it, and removed it
                return Outcome.done(what, KIND, "already gone (ran, or was cancelled)")
            # The last look, through the descriptors: what was read is what was checked.
            try:
                check_again(self.fmt, opened, dir_fd)
            except EntryError as err:
                return _refuse(what, str(err))
            ran = spawn.run_as(user, body["argv"], env, body["cwd"], body["timeout"])
            return self._ran(dir_fd, what, opened, body["argv"][0], ran)
        except (KeyError, OSError) as err:
            why = err.strerror if isinstance(err, OSError) else "its user vanished"
            log.warning("%s: cannot run: %s", what, why)
            return Outcome.failed(what, KIND, f"failed: {why}", counts=("hook_failures",))

    def _ran(self, dir_fd: int, what: str, opened: Opened, argv0: str, ran: spawn.Ran) -> Outcome:
        extra = {
            "hook": {
                "argv0": argv0,
                "uid": opened.entry.uid,
                "returncode": ran.returncode,
                "timed_out": ran.timed_out,
                "seconds": round(ran.seconds, 3),
                "output_tail": ran.tail,
            }
        }
        counts = ["hook_runs"]
        if not ran.ok:
            counts.append("hook_timeouts" if ran.timed_out else "hook_failures")
            log.warning("%s: %s; output: %r", what, ran.describe(), ran.tail[-200:])
            why = f"failed: {ran.describe()}"
            return Outcome.failed(what, KIND, why, extra=extra, counts=tuple(counts))
        detail = f"ran: {ran.describe()}"
        # Gone before success is told: nothing that reads the outcome can run it again.
        try:
            remove_entry(self.fmt, dir_fd, opened)
        except OSError as err:
            # Not retried (it succeeded), but it stays: the next reconcile or start runs
            # it again.
            log.error("%s: ran, but it cannot be removed: %s", what, err.strerror)
            detail += f"; it cannot be removed ({err.strerror}) and it will run again"
        return Outcome.done(what, KIND, detail, extra=extra, counts=tuple(counts))


def _refuse(what: str, why: str) -> Outcome:
    log.warning("%s: refused: %s", what, why)
    return Outcome.refusal(what, KIND, why)
