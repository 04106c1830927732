"""On-death hooks: files in a spool, each naming an owner and a command. "Removing" one is
running its command as the file's owner, and deleting the file once it succeeded.

A hook runs as whoever owns its file, and at least once: the file goes only after its
command succeeded. docs/design.md ("On-death hooks") gives the spool's rules and why.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import pwd
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from exitwatch.contract import HOOK_MAX_TIMEOUT
from exitwatch.kinds import discovery, inotify
from exitwatch.kinds.base import Found, Gone, Notify, Outcome, Resource, ResourceKind, Snapshot
from exitwatch.kinds.fsops import printable
from exitwatch.kinds.hooks import spawn
from exitwatch.kinds.hooks.file import (
    KIND,
    SPOOL_OPEN,
    Hook,
    HookError,
    check_file,
    check_spool,
    ensure_spool,
    read_hook,
)
from exitwatch.kinds.hooks.spool import Spool
from exitwatch.owner import Owner

log = logging.getLogger(__name__)

POLL_INTERVAL = 1.0  # seconds between rescans when inotify cannot be used
# Hooks run on workers of their own, never the agent's removal pool: a hook may run for
# up to its timeout, and hung ones must not hold up the removal of containers and workdirs.
JOBS = 16  # dead owners whose hooks run at once
PARALLEL = 8  # hooks of one owner run at once
PER_UID = 8  # hooks of one user run at once, whatever their owners
LOCK_WAIT = HOOK_MAX_TIMEOUT + 60.0  # for another exitwatch process running the same hook
_SELF_GONE = inotify.IN_DELETE_SELF | inotify.IN_MOVE_SELF | inotify.IN_IGNORED


class Hooks(ResourceKind):
    """The hooks in one spool directory."""

    kind = KIND
    ages_pending = False  # a hook may rightly run for up to an hour

    def __init__(self, path: str) -> None:
        self.path = path
        self.executor = ThreadPoolExecutor(JOBS, thread_name_prefix="exitwatch-hook-run")
        self._slots: dict[int, threading.BoundedSemaphore] = {}
        self._slots_lock = threading.Lock()
        self._discovery = discovery.Discovery("hook discovery", "exitwatch-hooks")

    def scan(self) -> Snapshot:
        """Every hook now. Raises OSError or HookError when the spool cannot be listed: an
        empty listing would read as every hook gone."""
        # `exitwatch reap` has not made the spool, as the agent has: it checks it.
        try:
            check_spool(self.path)
        except FileNotFoundError:
            return Snapshot(KIND, ())
        except OSError as err:
            raise OSError(f"hook spool {printable(self.path)}: {err.strerror}") from None
        except HookError as err:
            raise HookError(f"hook spool {printable(self.path)}: {err}") from None
        found = Spool(self.path).list()
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
        event, a chmod, is seen at the file's next event or the next whole listing); a
        file that did not change is never read again."""
        spool = Spool(self.path)
        known: dict[str, Hook] | None = None
        changed: set[str] | None = None  # None: list the whole spool
        ino = None
        try:
            ino = inotify.Inotify()
            dir_fd = os.open(self.path, SPOOL_OPEN)
            try:
                ino.watch(dir_fd, self.path, 0)
            finally:
                os.close(dir_fd)
            log.info("following hooks in %s with inotify", printable(self.path))
        except OSError as err:
            log.warning(
                "hook discovery falls back to rescans every %gs: %s",
                POLL_INTERVAL,
                err.strerror or err,
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
                        if isinstance(err, OSError):
                            log.warning("%s; trying again every %gs", err, POLL_INTERVAL)
                        else:
                            log.exception("listing the hook spool failed; trying again")
                    failing = True
                    spool = Spool(self.path)  # what it knew may be half updated
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
                if discovery.wait(stop_fd, ino.fd, None):
                    return
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
        try:
            dir_fd = os.open(self.path, SPOOL_OPEN)
        except OSError as err:
            why = f"failed: spool {printable(self.path)}: {err.strerror}"
            return [Outcome.failed(self.what(r), KIND, why, key=r.key) for r in resources]

        def one(res: Resource) -> Outcome:
            # Each says which hook it is about, so that only the hooks that failed are retried.
            try:
                outcome = self._run_one(dir_fd, owner, res, dry_run, how)
            except Exception as err:  # one hook's surprise must not cost the others theirs
                log.error("%s: cannot run: %s: %s", self.what(res), type(err).__name__, err)
                why = f"failed: {type(err).__name__}: {err}"
                outcome = Outcome.failed(self.what(res), KIND, why, counts=("hook_failures",))
            return replace(outcome, key=res.key)

        try:
            if len(resources) == 1:
                return [one(resources[0])]
            # Side by side: one hook that hangs until its timeout holds up none of the others.
            with ThreadPoolExecutor(min(len(resources), PARALLEL)) as pool:
                return list(pool.map(one, resources))
        finally:
            os.close(dir_fd)

    def _run_one(
        self, dir_fd: int, owner: Owner, res: Resource, dry_run: bool, how: str
    ) -> Outcome:
        what = self.what(res)
        try:
            hook, body, fd = read_hook(dir_fd, res.key)
        except FileNotFoundError:
            return Outcome.done(what, KIND, "already gone (ran, or was cancelled)")
        except HookError as err:
            log.warning("%s: refused: %s", what, err)
            return Outcome.refusal(what, KIND, str(err))
        try:
            expected = (getattr(res, "dev", 0), getattr(res, "ino", 0), getattr(res, "uid", -1))
            if (hook.dev, hook.ino, hook.uid) != expected:
                return _refuse(what, "it was replaced since it was found")
            if hook.owner != owner:
                return _refuse(what, f"it now names owner {hook.owner}, not {owner}")
            if dry_run:
                return Outcome.done(what, KIND, "would run")
            user = pwd.getpwuid(hook.uid)
            env = spawn.environment(user, body["env"])
            env |= {"EXITWATCH_DEAD_OWNER": str(owner), "EXITWATCH_DEATH": how}
            # `exitwatch reap` beside the agent (or the agent before a reload): whoever
            # locks the file runs it; the other waits for it, on a hook worker, and then
            # finds it gone (or failed, and runs it itself). No attempt is spent on waiting.
            # The lock goes with the descriptor.
            if not _lock(fd, LOCK_WAIT):
                return Outcome.failed(what, KIND, "another exitwatch process is running it")
            if os.fstat(fd).st_nlink == 0:  # the other ran it, and removed it, since we opened it
                return Outcome.done(what, KIND, "already gone (ran, or was cancelled)")
            # The last look, through the descriptor: the file read is the file checked.
            try:
                st = check_file(fd, dir_fd)
            except HookError as err:
                return _refuse(what, str(err))
            if (st.st_ino, st.st_uid) != (hook.ino, hook.uid):
                return _refuse(what, "it changed while being read")
            with self._slot(hook.uid):
                ran = spawn.run_as(user, body["argv"], env, body["cwd"], body["timeout"])
            return self._ran(dir_fd, what, res.key, hook, body["argv"][0], ran)
        except (KeyError, OSError) as err:
            why = err.strerror if isinstance(err, OSError) else "its user vanished"
            log.warning("%s: cannot run: %s", what, why)
            return Outcome.failed(what, KIND, f"failed: {why}", counts=("hook_failures",))
        finally:
            os.close(fd)  # and with it the lock, once the file is gone (or kept for a retry)

    def _slot(self, uid: int) -> threading.BoundedSemaphore:
        """The PER_UID run slots of `uid`: how many hook processes one user has at once."""
        with self._slots_lock:
            return self._slots.setdefault(uid, threading.BoundedSemaphore(PER_UID))

    def _ran(
        self, dir_fd: int, what: str, name: str, hook: Hook, argv0: str, ran: spawn.Ran
    ) -> Outcome:
        extra = {
            "hook": {
                "argv0": argv0,
                "uid": hook.uid,
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
            _unlink_same(dir_fd, name, hook)
        except OSError as err:
            # Not retried (it succeeded), but the file stays: the next reconcile or start
            # runs it again.
            log.error("%s: ran, but its file cannot be removed: %s", what, err.strerror)
            detail += f"; its file cannot be removed ({err.strerror}) and it will run again"
        return Outcome.done(what, KIND, detail, extra=extra, counts=tuple(counts))


def _lock(fd: int, wait: float) -> bool:
    """Lock the hook file, waiting up to `wait` seconds for whoever holds it."""
    deadline, pause = time.monotonic() + wait, 0.05
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
        time.sleep(pause)  # a lock has no wakeup to wait on but a blocking flock, unbounded
        pause = min(pause * 2, 1.0)


def _refuse(what: str, why: str) -> Outcome:
    log.warning("%s: refused: %s", what, why)
    return Outcome.refusal(what, KIND, why)


def _unlink_same(dir_fd: int, name: str, hook: Hook) -> None:
    """Remove the hook's file if its name still leads to it (its owner may have put a new
    hook in its place meanwhile, which is theirs to keep)."""
    with contextlib.suppress(FileNotFoundError):
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if (st.st_dev, st.st_ino) == (hook.dev, hook.ino):
            os.unlink(name, dir_fd=dir_fd)
