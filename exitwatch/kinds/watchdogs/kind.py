"""Watchdogs: directories in a spool, each holding a file that names an owner and a timeout.
While the owner lives, a pet (a touch of the file: its change time moves) keeps it armed;
once `timeout` seconds pass without one, the agent ends the owner: SIGTERM and SIGCONT, then
SIGKILL after its grace. From then on it is a dead owner like any other. "Removing" a
watchdog (its owner is dead) is deleting its directory.

Before it signals, the agent holds a pidfd of the owner, checks through /proc that the
process is still that owner (its start time) and that it runs as the user who armed the
watchdog (or root armed it); a signal through the pidfd reaches that process or none. What
cannot be read (a full fd table, a transient /proc error) proves nothing: it never fires
then, and looks again a second later.
"""

from __future__ import annotations

import collections
import logging
import os
import select
import signal
import threading
import time
from collections.abc import KeysView

from exitwatch import owner as owners
from exitwatch import procfs
from exitwatch.alive import WATCHDOG_FILE, watchdog_problem
from exitwatch.kinds.base import Acted, Notify, Outcome, Resource
from exitwatch.kinds.fsops import printable
from exitwatch.kinds.spool.entry import (
    Entry,
    EntryError,
    Format,
    read_entry,
    spool_fd,
)
from exitwatch.kinds.spool.timed import TimedSpoolKind
from exitwatch.kinds.watchdogs.armed import Armed, Fired, Firing, WatchdogsHealth, pet_time
from exitwatch.owner import Owner

log = logging.getLogger(__name__)

KIND = "watchdog"
AGAIN = 1.0  # seconds before a look that could not be made is made again
# A file's times are the kernel's coarse clock, up to a tick (4 ms at 250 Hz) behind the
# pet: a watchdog fires this much after its timeout, never before.
COARSE = 0.02
RECENT = 20  # the last firings status shows
_PIN = os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC

FORMAT = Format(
    "watchdog",
    WATCHDOG_FILE,
    watchdog_problem,
    show=lambda name, body: f"{name}: {body['timeout']:g} s",
    unusable="no watchdog fires",
    keep=lambda body: (float(body["timeout"]), float(body["grace"]), body.get("reason", "")),
)


# The agent's reload (SIGHUP) makes its kinds anew in the same process: what one stopped
# watchdog kind knew, the next one started takes on. The pets seen, so that a reload is no
# pet (an owner that hangs would live one timeout more at each); and the owners in their
# grace, whose SIGKILL is due all the same (one ignoring SIGTERM would escape it). By spool
# path (agents of a test session share a process); the first listing of the new kind drops
# what its spool does not hold, but for those in their grace.
_handed: dict[str, dict[str, Armed]] = {}
_handed_lock = threading.Lock()


class Watchdogs(TimedSpoolKind):
    """The watchdogs in one spool directory, and the timer that fires them."""

    kind = KIND
    fmt = FORMAT

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self._armed: dict[str, Armed] = {}
        self._counts: collections.Counter[str] = collections.Counter()
        self._recent: collections.deque[Firing] = collections.deque(maxlen=RECENT)
        self._last_unreadable: str | None = None
        self._said: set[str] = set()  # what cannot be read, said once per watchdog
        self._notify: Notify | None = None

    # -- following ---------------------------------------------------------------------------

    def start(self, notify: Notify) -> None:
        self._notify = notify
        with _handed_lock, self._cond:
            for key, armed in _handed.pop(self.path, {}).items():
                self._armed[key] = armed
                self._at(key, armed.due)
        super().start(notify)

    def _followed(self) -> KeysView[str]:
        return self._armed.keys()

    def _seen(self, entry: Entry) -> None:
        self._arm(entry)

    def _went(self, key: str) -> None:
        self._disarm(key)

    def _due_at(self, key: str) -> float | None:
        armed = self._armed.get(key)
        return None if armed is None else armed.due

    def _arm(self, entry: Entry) -> None:
        """A watchdog seen: first seen, it counts as petted now (the agent saw no earlier
        pet: after a restart, a hung owner gets one timeout more, never one less)."""
        old = self._armed.get(entry.key)
        if old is not None and old.entry == entry:
            return
        if old is not None and old.fired is not None:
            return  # it fired: the owner is being ended, whatever the file says now
        now = time.monotonic()
        # No stamp yet: the first look reads the file's change time as a pet, held within
        # [now, that look], which is right whether it was petted since or not.
        armed = Armed(entry, (0, 0), now, time.time(), now, now + entry.detail[0])
        self._armed[entry.key] = armed
        self._at(entry.key, armed.due)

    def _disarm(self, key: str) -> None:
        self._said.discard(key)
        armed = self._armed.pop(key, None)
        if armed is not None and armed.fired is not None and not armed.fired.done:
            self._armed[key] = armed  # the grace runs out all the same: SIGKILL is due

    def stop(self) -> None:
        super().stop()

        def hand_on() -> None:
            # The timer acts no more: what it followed is handed on, the pidfds of SIGKILLs
            # due included. A stopped agent sends none; the kind its reload starts does.
            _handed[self.path] = dict(self._armed)

        with _handed_lock:
            if not self._halt(hand_on):  # stopped already: what it followed may be another's
                return
        self._join()

    # -- the timer ---------------------------------------------------------------------------

    def _act(self, key: str, now: float) -> None:
        armed = self._armed[key]
        try:
            self._look(armed, now)
        except Exception as err:  # one look's surprise must not end them all
            if armed.entry.key not in self._said:  # its traceback, once
                log.exception("%s: its look failed", self.what(armed.entry))
            self._unreadable(armed.entry, f"{type(err).__name__}: {err}")
            self._later(armed, now + AGAIN)

    def _later(self, armed: Armed, at: float) -> None:
        armed.due = at
        self._at(armed.entry.key, at)

    def _look(self, armed: Armed, now: float) -> None:
        """Its time is up, as far as was known: fire, unless a pet came meanwhile."""
        if armed.fired is not None:
            self._kill(armed, now)
            return
        stamp = self._stamp(armed.entry)
        if stamp is None:  # cannot be read now: proves nothing
            self._later(armed, now + AGAIN)
            return
        wall = time.time()
        if stamp != armed.stamp:
            # Petted since the last look: its change time is the kernel's wall clock at the
            # pet, which the pet's writer cannot set (pet_time says how it is read).
            armed.pet = pet_time(armed.looked, armed.looked_wall, now, wall, stamp[0] / 1e9)
            armed.stamp = stamp
        armed.looked, armed.looked_wall = now, wall
        due = armed.pet + armed.entry.detail[0] + COARSE
        if due > now:
            self._later(armed, due)
            return
        self._fire(armed, now)

    def _stamp(self, entry: Entry) -> tuple[int, int] | None:
        """The watchdog file's (ctime, mtime) in ns, or None when it cannot be read now
        (said once). A file gone is not read as a pet: its Gone is on its way."""
        try:
            dir_fd = spool_fd(self.path)
            try:
                # Its directory through no symlink (its user may swap one in), then its file.
                pin = os.open(entry.key, _PIN, dir_fd=dir_fd)
                try:
                    st = os.stat(WATCHDOG_FILE, dir_fd=pin, follow_symlinks=False)
                finally:
                    os.close(pin)
                if (st.st_dev, st.st_ino) != (entry.dev, entry.ino):
                    self._rearmed(dir_fd, entry)
                    return None
            finally:
                os.close(dir_fd)
        except FileNotFoundError:
            return None
        except (OSError, EntryError) as err:
            self._unreadable(entry, f"its file: {getattr(err, 'strerror', None) or err}")
            return None
        return (st.st_ctime_ns, st.st_mtime_ns)

    def _rearmed(self, dir_fd: int, entry: Entry) -> None:
        """Its file was replaced (armed again, perhaps with another timeout), which raises
        no event in the spool: read now, and armed anew, rather than at the next whole
        listing. One refused is not armed; the listing says why.

        The new file is a pet made when it was written, not when this look saw it (a look
        comes at the old timeout's end): it is looked at again at once, its change time
        read as a pet since the last look. `exitwatch run --max-time`, armed again for
        what is left of it, then ends when that runs out, not an old timeout later."""
        try:
            opened = read_entry(FORMAT, KIND, dir_fd, entry.key)
        except (FileNotFoundError, EntryError):
            self._armed.pop(entry.key, None)
            return
        opened.close()
        if opened.entry.owner == entry.owner and opened.entry.uid == entry.uid:
            old = self._armed.get(entry.key)
            self._arm(opened.entry)
            new = self._armed.get(entry.key)
            if old is not None and new is not None and new is not old:
                new.looked, new.looked_wall, new.pet = old.looked, old.looked_wall, old.looked
                self._later(new, time.monotonic())
        else:
            self._armed.pop(entry.key, None)

    def _unreadable(self, entry: Entry, why: str) -> None:
        self._counts["unreadable"] += 1
        self._last_unreadable = f"{self.what(entry)}: {why}"
        if entry.key not in self._said:
            self._said.add(entry.key)
            text = f"{self.what(entry)}: cannot look now, so it does not fire: {why}"
            self._spool.warnings.warn(entry.uid, text)

    def _fire(self, armed: Armed, now: float) -> None:
        entry, (_, grace, reason) = armed.entry, armed.entry.detail
        owner = entry.owner
        try:
            found = self._owner(owner)
        except OSError as err:  # EMFILE, a transient /proc error: proves nothing
            self._unreadable(entry, f"its owner {owner}: {err.strerror or err}")
            self._later(armed, now + AGAIN)
            return
        self._said.discard(entry.key)
        if found is None:
            # Dead already (or another machine's): nothing to end; the agent removes it.
            self._armed.pop(entry.key, None)
            return
        pidfd, uids = found
        if entry.uid != 0 and any(uid != entry.uid for uid in uids):
            os.close(pidfd)
            self._counts["refused"] += 1
            # As the listing's refusals are: a few lines of one user's a minute, then one
            # that counts the rest (a user may write a thousand, and again and again).
            self._spool.warnings.warn(
                entry.uid,
                f"{self.what(entry)}: refused: its owner {owner} runs as uid {uids[1]}, not as "
                f"uid {entry.uid} who armed it; it is not fired",
            )
            self._armed.pop(entry.key, None)  # looked at again if its file changes
            return
        after = round(now - armed.pet, 1)
        why = f"ended by its watchdog after {after:g} s without a pet"
        if reason:
            why += f" ({printable(reason)})"
        if self.dry_run:
            os.close(pidfd)
            log.warning("%s: would end owner %s (dry run): %s", self.what(entry), owner, why)
            self._armed.pop(entry.key, None)  # said once; armed again if its file changes
            return
        try:
            signal.pidfd_send_signal(pidfd, signal.SIGTERM)
            signal.pidfd_send_signal(pidfd, signal.SIGCONT)  # a stopped one acts on it now
        except ProcessLookupError:
            os.close(pidfd)
            self._armed.pop(entry.key, None)
            return
        except OSError as err:  # EPERM: the agent lacks CAP_KILL
            os.close(pidfd)
            self._unreadable(entry, f"cannot signal its owner {owner}: {err.strerror}")
            self._later(armed, now + AGAIN)
            return
        firing: Firing = {
            "time": round(time.time(), 3),
            "owner": str(owner),
            "watchdog": entry.key,
            "after_s": after,
            "killed": False,
        }
        armed.fired = Fired(pidfd, now, now + grace, firing)
        self._counts["fired"] += 1
        self._recent.append(firing)
        detail = f"SIGTERM sent; SIGKILL after {grace:g} s if it still runs"
        self._tell(entry, why, detail)
        self._later(armed, now + grace)

    @staticmethod
    def _owner(owner: Owner) -> tuple[int, tuple[int, ...]] | None:
        """A pidfd of `owner` and its uids (real, effective, saved, file system), read after
        the pidfd was opened and the owner judged alive through it; None when it is dead.
        Raises OSError when that cannot be read now."""
        pidfd = owners.pidfd(owner)
        if pidfd is None:
            return None
        try:
            return pidfd, procfs.uids(owner.pid)
        except ProcessLookupError:
            os.close(pidfd)
            return None
        except BaseException:
            os.close(pidfd)
            raise

    def _kill(self, armed: Armed, now: float) -> None:
        """The grace ran out: SIGKILL, unless it exited (its pidfd is readable then)."""
        fired = armed.fired
        assert fired is not None
        if not fired.done:
            fired.done = True
            # poll, not select: the agent may hold more than 1024 descriptors (a pidfd per
            # owner in its grace, a thousand of one user's at once), and select() takes none
            # past 1023 (ValueError, which would end this thread and every watchdog with it).
            poller = select.poll()
            poller.register(fired.pidfd, select.POLLIN)
            exited = bool(poller.poll(0))
            if not exited:
                try:
                    signal.pidfd_send_signal(fired.pidfd, signal.SIGKILL)
                    fired.firing["killed"] = True
                    self._counts["killed"] += 1
                    log.warning(
                        "%s: owner %s still ran %g s after SIGTERM: SIGKILL sent",
                        self.what(armed.entry),
                        armed.entry.owner,
                        armed.entry.detail[1],
                    )
                except ProcessLookupError:
                    pass
            os.close(fired.pidfd)
        self._armed.pop(armed.entry.key, None)

    def _tell(self, entry: Entry, why: str, detail: str) -> None:
        """The firing, to the agent's record: one log line and one audit line."""
        timeout, grace, _ = entry.detail
        extra = {"watchdog": {"id": entry.key, "uid": entry.uid, "timeout": timeout}}
        extra["watchdog"]["grace"] = grace
        outcome = Outcome.done(f"owner pid {entry.owner.pid}", KIND, detail, extra=extra)
        if self._notify is not None:
            self._notify(Acted(entry.owner, why, outcome))

    # -- removal: the owner is dead ----------------------------------------------------------

    def remove(
        self, owner: Owner, resources: list[Resource], dry_run: bool, how: str
    ) -> list[Outcome]:
        """Delete the dead owner's watchdogs."""
        return self.delete(resources, dry_run, "removed")

    def health(self) -> WatchdogsHealth:
        with self._cond:
            return {
                "armed": sum(a.fired is None for a in self._armed.values()),
                "fired": self._counts["fired"],
                "killed": self._counts["killed"],
                "refused": self._counts["refused"],
                "unreadable": self._counts["unreadable"],
                "last_unreadable": self._last_unreadable,
                "recent": list(self._recent),
            }
