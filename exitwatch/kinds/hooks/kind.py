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
import time
from collections.abc import Hashable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from exitwatch.contract import HOOK_MAX_TIMEOUT
from exitwatch.kinds import discovery, inotify
from exitwatch.kinds.base import Found, Gone, Notify, Outcome, Resource, ResourceKind, Snapshot
from exitwatch.kinds.fsops import printable
from exitwatch.kinds.hooks import spawn
from exitwatch.kinds.hooks.file import (
    Hook,
    HookError,
    Opened,
    check_again,
    ensure_spool,
    read_hook,
    remove_hook,
    spool_fd,
)
from exitwatch.kinds.hooks.spool import Spool
from exitwatch.owner import Owner

log = logging.getLogger(__name__)

KIND = "hook"

POLL_INTERVAL = 1.0  # seconds between rescans when inotify cannot be used
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
_SELF_GONE = inotify.IN_DELETE_SELF | inotify.IN_MOVE_SELF | inotify.IN_IGNORED


class Hooks(ResourceKind):
    """The hooks in one spool directory."""

    kind = KIND
    ages_pending = False  # a hook may rightly run for up to an hour
    lane_limit = PER_UID
    busy_wait = LOCK_WAIT

    def __init__(self, path: str) -> None:
        self.path = path
        self.executor = ThreadPoolExecutor(JOBS, thread_name_prefix="exitwatch-hook-run")
        # Shared by discovery and the scans: one user's entries are remembered (and warned
        # about) once, however often the spool is listed.
        self._spool = Spool(KIND, path)
        self._discovery = discovery.Discovery("hook discovery", "exitwatch-hooks")

    def lane(self, res: Resource) -> Hashable:
        return res.uid if isinstance(res, Hook) else None

    def scan(self) -> Snapshot:
        """Every hook now. Raises OSError or HookError when the spool cannot be listed: an
        empty listing would read as every hook gone."""
        found = self._spool.list()
        return Snapshot(KIND, tuple(found[n] for n in sorted(found)))

    def start(self, notify: Notify) -> None:
        try:
            ensure_spool(self.path)
        except (OSError, HookError) as err:
            why = err.strerror if isinstance(err, OSError) else str(err)
            log.error("hook spool %s: %s; no hook runs", printable(self.path), why)
            notify(Snapshot(KIND, ()))
            return
        self._discovery.start(lambda stop_fd: self._follow(notify, stop_fd))

    def stop(self) -> None:
        self._discovery.stop()

    def _follow(self, notify: Notify, stop_fd: int) -> None:
        """A Snapshot, then Found and Gone as the spool changes. With inotify, the names an
        event gives are looked at again, not the whole spool (a change that raises no
        event, a chmod or one inside a hook's directory, is seen at the entry's next event
        or the next whole listing, and everything is checked again before a hook runs);
        an entry that did not change is never read again."""
        spool = self._spool
        known: dict[str, Hook] | None = None
        changed: set[str] | None = None  # None: list the whole spool
        ino = None
        try:
            ino = inotify.Inotify()
            dir_fd = spool_fd(self.path)
            try:
                ino.watch(dir_fd, self.path, 0)
            finally:
                os.close(dir_fd)
            log.info("following hooks in %s with inotify", printable(self.path))
        except (OSError, HookError) as err:
            log.warning(
                "hook discovery falls back to rescans every %gs: %s",
                POLL_INTERVAL,
                getattr(err, "strerror", None) or err,
            )
            if ino is not None:
                ino.close()
            ino = None
        failing = False  # the spool could not be listed; listed whole again soon
        try:
            while True:
                try:
                    found = spool.list(changed)
                    failing = False
                except Exception as err:  # it must not die, or no hook is seen again
                    # What was known stands: a listing that failed says nothing of the hooks.
                    if not failing:
                        if isinstance(err, OSError | HookError):
                            log.warning("%s; trying again every %gs", err, POLL_INTERVAL)
                        else:
                            log.exception("listing the hook spool failed; trying again")
                    failing = True
                    spool.reset()  # what it knew may be half updated
                    found = known or {}
                if known is None:
                    notify(Snapshot(KIND, tuple(found[n] for n in sorted(found))))
                else:
                    for name in known.keys() - found.keys():
                        notify(Gone(KIND, name))
                    for name, hook in found.items():
                        if known.get(name) != hook:
                            notify(Found(hook))
                known = found
                if ino is None or failing:
                    if discovery.wait(stop_fd, None, POLL_INTERVAL):
                        return
                    changed = None
                    continue
                # Woken by events, or when a refusal that may not last is due another look.
                due = spool.next_again()
                wait = None if due is None else max(0.0, due - time.monotonic())
                if discovery.wait(stop_fd, ino.fd, wait):
                    return
                if due is not None and time.monotonic() >= due:
                    changed = set()  # the due refusals alone (list() adds them)
                    continue
                # Only the names the events give are looked at again; an overflow (events
                # lost) or an event without a name, the whole spool.
                events = ino.read()
                changed = {name for _, _, name in events}
                if "" in changed:
                    changed = None
                if any(mask & _SELF_GONE for _, mask, _ in events):
                    log.warning(
                        "hook spool %s was removed or moved; rescanning every %gs",
                        printable(self.path),
                        POLL_INTERVAL,
                    )
                    ino.close()
                    ino = None
        finally:
            if ino is not None:
                ino.close()

    # Running ("removal")

    def remove(
        self, owner: Owner, resources: list[Resource], dry_run: bool, how: str
    ) -> list[Outcome]:
        """Run the hooks, one after another: the agent hands over one per job (a lane of
        its user), so that hooks run side by side on its workers, PER_UID of a user."""
        try:
            dir_fd = spool_fd(self.path)
        except (OSError, HookError) as err:
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
            opened = read_hook(KIND, dir_fd, res.key)
        except FileNotFoundError:
            return Outcome.done(what, KIND, "already gone (ran, or was cancelled)")
        except HookError as err:
            log.warning("%s: refused: %s", what, err)
            return Outcome.refusal(what, KIND, str(err))
        try:
            return self._run_opened(dir_fd, owner, res, opened, dry_run, how)
        finally:
            opened.close()  # and with it the lock, once the hook is gone (or kept for a retry)

    def _run_opened(
        self, dir_fd: int, owner: Owner, res: Resource, opened: Opened, dry_run: bool, how: str
    ) -> Outcome:
        what, hook, body = self.what(res), opened.hook, opened.body
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
                check_again(opened, dir_fd)
            except HookError as err:
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
                "uid": opened.hook.uid,
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
            remove_hook(dir_fd, opened)
        except OSError as err:
            # Not retried (it succeeded), but it stays: the next reconcile or start runs
            # it again.
            log.error("%s: ran, but it cannot be removed: %s", what, err.strerror)
            detail += f"; it cannot be removed ({err.strerror}) and it will run again"
        return Outcome.done(what, KIND, detail, extra=extra, counts=tuple(counts))


def _refuse(what: str, why: str) -> Outcome:
    log.warning("%s: refused: %s", what, why)
    return Outcome.refusal(what, KIND, why)
