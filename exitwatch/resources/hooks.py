"""On-death hooks: files in a spool, each naming an owner and a command. "Removing" one is
running its command as the file's owner, and deleting the file once it succeeded.

The spool is one flat directory, root's, mode 1733 like /tmp: anyone may add a file, only
its writer may remove it, and no one but root may list it. A hook runs as whoever owns its
file, so writing a hook gives no one more rights than they have. A file that is not
exactly what on_death() writes is refused with a warning, and never runs.

A hook runs at least once: the file goes only after its command succeeded, so an agent
that dies between the two runs the hook again at its next start. Hooks should therefore
tolerate finding their resource gone already (a DELETE that answers 404, say).
"""

from __future__ import annotations

import collections
import contextlib
import errno
import fcntl
import logging
import os
import pwd
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from exitwatch.contract import HOOK_MAX_TIMEOUT, HOOK_SUFFIX
from exitwatch.owner import Owner, death
from exitwatch.resources import discovery, fsops, hookrun
from exitwatch.resources.base import Found, Gone, Notify, Outcome, Resource, ResourceKind, Snapshot
from exitwatch.resources.fsops import printable
from exitwatch.resources.hookfile import (
    KIND,
    Hook,
    HookError,
    check_file,
    check_spool,
    ensure_spool,
    read_hook,
)

log = logging.getLogger(__name__)

POLL_INTERVAL = 1.0  # seconds between rescans when inotify cannot be used
# Hooks run on workers of their own, never the agent's removal pool: a hook may run for
# up to its timeout, and hung ones must not hold up the removal of containers and workdirs.
JOBS = 16  # dead owners whose hooks run at once
PARALLEL = 8  # hooks of one owner run at once
PER_UID = 8  # hooks of one user run at once, whatever their owners
MAX_PER_UID = 1024  # hooks of one user the agent holds; more are refused with a warning
LOCK_WAIT = HOOK_MAX_TIMEOUT + 60.0  # for another exitwatch process running the same hook
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_SELF_GONE = fsops.IN_DELETE_SELF | fsops.IN_MOVE_SELF | fsops.IN_IGNORED


class _Spool:
    """The hooks in the spool, read again only when a file changed. One per thread."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._seen: dict[str, tuple[tuple[int, ...], Hook | None]] = {}
        self._warned: dict[str, str] = {}  # name: refusal, for refusals not cached in _seen
        self._capped: set[str] = set()  # names left out as over their user's MAX_PER_UID
        self._unlistable = False

    def list(self) -> dict[str, Hook]:
        try:
            dir_fd = os.open(self.path, _DIR)
        except OSError as err:
            if not self._unlistable and err.errno != errno.ENOENT:
                log.warning("hook spool %s: %s; no hooks seen", printable(self.path), err.strerror)
            self._unlistable = True
            return {}
        try:
            return self._list(dir_fd)
        finally:
            os.close(dir_fd)

    def _list(self, dir_fd: int) -> dict[str, Hook]:
        seen, found = {}, {}
        try:
            names = os.listdir(dir_fd)
        except OSError as err:
            if not self._unlistable:
                log.warning("hook spool %s: %s; no hooks seen", printable(self.path), err.strerror)
            self._unlistable = True
            return {}
        self._unlistable = False
        for name in names:
            if name.startswith("."):  # a hook being written
                continue
            try:
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except OSError:  # gone since the listing
                continue
            sig = (st.st_ino, st.st_mode, st.st_uid, st.st_nlink, st.st_size, st.st_mtime_ns)
            old = self._seen.get(name)
            if old is not None and old[0] == sig:
                seen[name], hook = old, old[1]
            else:
                hook, lasting = self._read(dir_fd, name)
                if lasting:
                    seen[name] = (sig, hook)
            if hook is not None:
                found[name] = hook
        self._seen = seen
        listed = set(names)
        self._warned = {n: w for n, w in self._warned.items() if n in listed}
        return self._cap(found)

    def _cap(self, found: dict[str, Hook]) -> dict[str, Hook]:
        """`found` without each user's hooks past the first MAX_PER_UID (by name): one
        user's spool files cannot grow the agent's memory without end."""
        held: collections.Counter[int] = collections.Counter()
        capped = set()
        for name in sorted(found):
            held[found[name].uid] += 1
            if held[found[name].uid] > MAX_PER_UID:
                capped.add(name)
                if name not in self._capped:
                    where = printable(os.path.join(self.path, name))
                    log.warning(
                        "hook file %s: refused: uid %d has more than %d hooks",
                        where,
                        found[name].uid,
                        MAX_PER_UID,
                    )
        self._capped = capped
        return {n: h for n, h in found.items() if n not in capped}

    def _read(self, dir_fd: int, name: str) -> tuple[Hook | None, bool]:
        """The hook in `name`, or None; and whether that answer holds until the file
        changes (a refusal that may not, such as an unanswered user lookup, is looked at
        again at the next listing, and warned about once)."""
        where = printable(os.path.join(self.path, name))
        if not name.endswith(HOOK_SUFFIX):
            log.warning("hook file %s: refused: its name does not end in %s", where, HOOK_SUFFIX)
            return None, True
        try:
            hook, _, fd = read_hook(dir_fd, name)
        except FileNotFoundError:
            return None, True
        except HookError as err:
            if err.lasting or self._warned.get(name) != str(err):
                log.warning("hook file %s: refused: %s", where, err)
            if not err.lasting:
                self._warned[name] = str(err)
            return None, err.lasting
        os.close(fd)
        self._warned.pop(name, None)
        return hook, True


class Hooks(ResourceKind):
    """The hooks in one spool directory."""

    kind = KIND

    def __init__(self, path: str) -> None:
        self.path = path
        self.executor = ThreadPoolExecutor(JOBS, thread_name_prefix="exitwatch-hooks")
        self._slots: dict[int, threading.BoundedSemaphore] = {}
        self._slots_lock = threading.Lock()
        self._discovery = discovery.Discovery("hook discovery", "exitwatch-hooks")

    def scan(self) -> Snapshot:
        # `exitwatch reap` has not made the spool, as the agent has: it checks it.
        try:
            check_spool(self.path)
        except FileNotFoundError:
            return Snapshot(KIND, ())
        except (OSError, HookError) as err:
            why = err.strerror if isinstance(err, OSError) else str(err)
            log.error("hook spool %s: %s; no hook runs", printable(self.path), why)
            return Snapshot(KIND, ())
        found = _Spool(self.path).list()
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
        """A Snapshot, then Found and Gone as the spool changes: any event in it makes it
        be listed again (files that did not change are not read again)."""
        spool = _Spool(self.path)
        known: dict[str, Hook] | None = None
        ino = None
        try:
            ino = fsops.Inotify()
            dir_fd = os.open(self.path, _DIR)
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
        try:
            while True:
                try:
                    found = spool.list()
                except Exception:  # it must not die, or no hook is seen again
                    log.exception("listing the hook spool failed; trying again")
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
                if ino is None:
                    if discovery.wait(stop_fd, None, POLL_INTERVAL):
                        return
                    continue
                if discovery.wait(stop_fd, ino.fd, None):
                    return
                # Which file changed does not matter: the spool is listed again.
                if any(mask & _SELF_GONE for _, mask, _ in ino.read()):
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

    def remove(self, owner: Owner, resources: list[Resource], dry_run: bool) -> list[Outcome]:
        return self.reap(owner, resources, dry_run, death(owner) or "")

    def reap(
        self, owner: Owner, resources: list[Resource], dry_run: bool, how: str
    ) -> list[Outcome]:
        # As for the other kinds: nothing runs on a verdict that is not this one's.
        if death(owner) is None:
            why = f"its owner {owner} is alive"
            return [Outcome(_what(r), KIND, False, why, True, key=r.key) for r in resources]
        try:
            dir_fd = os.open(self.path, _DIR)
        except OSError as err:
            why = f"failed: spool {printable(self.path)}: {err.strerror}"
            return [Outcome(_what(r), KIND, False, why, key=r.key) for r in resources]

        def one(res: Resource) -> Outcome:
            # Each says which hook it is about, so that only the hooks that failed are retried.
            try:
                outcome = self._run_one(dir_fd, owner, res, dry_run, how)
            except Exception as err:  # one hook's surprise must not cost the others theirs
                log.error("%s: cannot run: %s: %s", _what(res), type(err).__name__, err)
                why = f"failed: {type(err).__name__}: {err}"
                outcome = Outcome(_what(res), KIND, False, why, counts=("hook_failures",))
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
        what = _what(res)
        try:
            hook, body, fd = read_hook(dir_fd, res.key)
        except FileNotFoundError:
            return Outcome(what, KIND, True, "already gone (ran, or was cancelled)")
        except HookError as err:
            log.warning("%s: refused: %s", what, err)
            return Outcome(what, KIND, False, str(err), refused=True)
        try:
            expected = (getattr(res, "dev", 0), getattr(res, "ino", 0), getattr(res, "uid", -1))
            if (hook.dev, hook.ino, hook.uid) != expected:
                return _refuse(what, "it was replaced since it was found")
            if hook.owner != owner:
                return _refuse(what, f"it now names owner {hook.owner}, not {owner}")
            if dry_run:
                return Outcome(what, KIND, True, "would run")
            user = pwd.getpwuid(hook.uid)
            env = hookrun.environment(user, body["env"])
            env |= {"EXITWATCH_DEAD_OWNER": str(owner), "EXITWATCH_DEATH": how}
            # `exitwatch reap` beside the agent (or the agent before a reload): whoever
            # locks the file runs it; the other waits for it, on a hook worker, and then
            # finds it gone (or failed, and runs it itself). No attempt is spent on waiting.
            # The lock goes with the descriptor.
            if not _lock(fd, LOCK_WAIT):
                return Outcome(what, KIND, False, "another exitwatch process is running it")
            if os.fstat(fd).st_nlink == 0:  # the other ran it, and removed it, since we opened it
                return Outcome(what, KIND, True, "already gone (ran, or was cancelled)")
            # The last look, through the descriptor: the file read is the file checked.
            try:
                st = check_file(fd, dir_fd)
            except HookError as err:
                return _refuse(what, str(err))
            if (st.st_ino, st.st_uid) != (hook.ino, hook.uid):
                return _refuse(what, "it changed while being read")
            with self._slot(hook.uid):
                ran = hookrun.run_as(user, body["argv"], env, body["cwd"], body["timeout"])
            return self._ran(dir_fd, what, res.key, hook, body["argv"][0], ran)
        except (KeyError, OSError) as err:
            why = err.strerror if isinstance(err, OSError) else "its user vanished"
            log.warning("%s: cannot run: %s", what, why)
            return Outcome(what, KIND, False, f"failed: {why}", counts=("hook_failures",))
        finally:
            os.close(fd)  # and with it the lock, once the file is gone (or kept for a retry)

    def _slot(self, uid: int) -> threading.BoundedSemaphore:
        """The PER_UID run slots of `uid`: how many hook processes one user has at once."""
        with self._slots_lock:
            return self._slots.setdefault(uid, threading.BoundedSemaphore(PER_UID))

    def _ran(
        self, dir_fd: int, what: str, name: str, hook: Hook, argv0: str, ran: hookrun.Ran
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
            return Outcome(
                what, KIND, False, f"failed: {ran.describe()}", False, extra, tuple(counts)
            )
        detail = f"ran: {ran.describe()}"
        # Gone before success is told: nothing that reads the outcome can run it again.
        try:
            _unlink_same(dir_fd, name, hook)
        except OSError as err:
            # Not retried (it succeeded), but the file stays: the next start runs it again.
            log.error("%s: ran, but its file cannot be removed: %s", what, err.strerror)
            detail += f"; its file cannot be removed ({err.strerror}) and it will run again"
        return Outcome(what, KIND, True, detail, False, extra, tuple(counts))


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


def _what(res: Resource) -> str:
    return f"hook {res.name or res.key}"


def _refuse(what: str, why: str) -> Outcome:
    log.warning("%s: refused: %s", what, why)
    return Outcome(what, KIND, False, why, refused=True)


def _unlink_same(dir_fd: int, name: str, hook: Hook) -> None:
    """Remove the hook's file if its name still leads to it (its owner may have put a new
    hook in its place meanwhile, which is theirs to keep)."""
    with contextlib.suppress(FileNotFoundError):
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if (st.st_dev, st.st_ino) == (hook.dev, hook.ino):
            os.unlink(name, dir_fd=dir_fd)
