"""The entries of a spool (hooks, leases, watchdogs) as their kind sees them: listed whole
or by the names that changed, each entry read again only when it changed, and bounded per
user: what is remembered of one user's entries, and how many lines their refusals write."""

from __future__ import annotations

import collections
import contextlib
import errno
import logging
import os
import threading
import time
from dataclasses import dataclass

from exitwatch.kinds.fsops import printable
from exitwatch.kinds.spool.entry import (
    Entry,
    EntryError,
    Format,
    entry_problem,
    read_entry,
    spool_fd,
)

log = logging.getLogger(__name__)

# Entry directories of one user the agent reads and holds, good or refused: past them, that
# user's entries are refused unread. Only a user (or root) can make a directory of theirs
# in the spool that passes the entry checks, so no one can fill another's.
MAX_PER_UID = 1024
# Other entries of one uid (files, loose directories, bad names) remembered, so that they
# are warned about once; past them, they are refused again at each whole listing. Anyone
# can move a file of another uid's in, so these never count against the entries above.
MAX_STRAYS_PER_UID = 64
WARN_LINES = 5  # refusal warnings of one uid per WARN_INTERVAL; then one line counting the rest
WARN_INTERVAL = 60.0
# A refusal that may not last (a full fd table, a user database that did not answer) is
# looked at again AGAIN_FIRST seconds later, then twice as long each time, up to AGAIN_MAX.
AGAIN_FIRST = 1.0
AGAIN_MAX = 60.0


@dataclass(frozen=True)
class _Entry:
    uid: int
    sig: tuple[int, ...]
    entry: Entry | None  # None: refused, or an empty entry directory
    stray: bool  # not an entry's directory: counted among the uid's strays
    why: str = ""  # a refusal that may not last: looked at again from `again_at` on
    again_at: float = 0.0  # monotonic time
    tries: int = 0  # looks that found the same refusal: each doubles the wait for the next


class Warnings:
    """Refusal warnings, at most WARN_LINES per uid per WARN_INTERVAL, then one line that
    counts the rest: one user's files cannot flood the journal. Thread-safe."""

    def __init__(self, noun: str, held: str = "refused") -> None:
        self.noun = noun
        self.held = held  # what the lines held back say of their entries
        self._lock = threading.Lock()
        # uid -> [window start, lines written, lines held back, summarized in this window]
        self._windows: dict[int, list] = {}

    def warn(self, uid: int, text: str) -> None:
        now = time.monotonic()
        with self._lock:
            window = self._windows.get(uid)
            if window is not None and now - window[0] >= WARN_INTERVAL:
                self._summarize(uid, window)
                window = None
            if window is None:
                window = self._windows[uid] = [now, 0, 0, False]
            if window[1] < WARN_LINES:
                window[1] += 1
                log.warning("%s", text)
            else:
                window[2] += 1

    def flush(self) -> None:
        """After a listing: count what was held back, once per window as it is held back
        and once as the window ends; forget the windows that ended."""
        now = time.monotonic()
        with self._lock:
            for uid, window in list(self._windows.items()):
                ended = now - window[0] >= WARN_INTERVAL
                if window[2] and (ended or not window[3]):
                    self._summarize(uid, window)
                    window[3] = True
                if ended:
                    del self._windows[uid]

    def _summarize(self, uid: int, window: list) -> None:
        if window[2]:
            log.warning(
                "%s spool: %d more entries of uid %d %s (at most %d warnings per uid every %g s)",
                self.noun,
                window[2],
                uid,
                self.held,
                WARN_LINES,
                WARN_INTERVAL,
            )
            window[2] = 0


class Spool:
    """The entries of a spool, each read again only when it changed. Thread-safe: the
    kind's discovery thread and its scans share one."""

    def __init__(self, fmt: Format, kind: str, path: str) -> None:
        self.fmt = fmt
        self.kind = kind  # of the entries it finds: their kind's KIND
        self.path = path
        self.warnings = Warnings(fmt.noun)
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        """Forget everything: the next listing is a whole one, every entry read anew."""
        with self._lock:
            self._entries: dict[str, _Entry] = {}
            self._held: collections.Counter[int] = collections.Counter()  # entry dirs per uid
            self._strays: collections.Counter[int] = collections.Counter()
            self._listed = False  # whether the whole spool was listed since it could not be

    def list(self, changed: set[str] | None = None) -> dict[str, Entry]:
        """The good entries in the spool: listed whole, or, given the names that changed
        since the last listing, with only those looked at again (and the refusals that
        may not last). Raises OSError (or EntryError for a spool others could tamper
        with) when the spool cannot be listed now: an empty answer would read as every
        entry gone."""
        with self._lock:
            try:
                dir_fd = spool_fd(self.path)
            except OSError as err:
                self._listed = False
                if err.errno == errno.ENOENT:  # no spool: truly none
                    return {}
                raise OSError(f"{self._spool}: {err.strerror}") from None
            except EntryError as err:
                self._listed = False
                raise EntryError(f"{self._spool}: {err}") from None
            try:
                if changed is None or not self._listed:
                    self._list(dir_fd)
                else:
                    now = time.monotonic()
                    again = {n for n, e in self._entries.items() if e.why and e.again_at <= now}
                    for name in sorted(changed | again):
                        self._look(dir_fd, name)
            finally:
                os.close(dir_fd)
                self.warnings.flush()
            return {name: e.entry for name, e in self._entries.items() if e.entry is not None}

    @property
    def _spool(self) -> str:
        return f"{self.fmt.noun} spool {printable(self.path)}"

    def next_again(self) -> float | None:
        """When the next refusal that may not last is due another look (monotonic)."""
        with self._lock:
            return min((e.again_at for e in self._entries.values() if e.why), default=None)

    def _list(self, dir_fd: int) -> None:
        # Streamed, never held whole: 40,000 names of one user's would cost megabytes at
        # every listing. What is remembered and was not seen has gone.
        present = set()
        try:
            with os.scandir(dir_fd) as entries:
                for entry in entries:
                    self._look(dir_fd, entry.name)
                    if entry.name in self._entries:
                        present.add(entry.name)
        except OSError as err:
            self._listed = False
            raise OSError(f"{self._spool}: {err.strerror}") from None
        self._listed = True
        for name in self._entries.keys() - present:
            self._forget(name)

    def _look(self, dir_fd: int, name: str) -> None:
        """Bring what is known of entry `name` up to date; it is read again only if it
        changed, or was refused for a reason that may not last."""
        if name.startswith("."):  # an entry being written, or cancelled
            return
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:  # gone
            self._forget(name)
            return
        noun = self.fmt.noun
        problem = entry_problem(name, st, noun)
        sig = _sig(st)
        if problem is None:
            # And its file's: a change inside an entry's directory (a new file, a mount over
            # it) leaves the directory's own stat as it was.
            with contextlib.suppress(OSError):  # none: an empty entry directory
                file = f"{name}/{self.fmt.file}"
                sig += _sig(os.stat(file, dir_fd=dir_fd, follow_symlinks=False))
        old = self._entries.get(name)
        if old is not None and old.sig == sig and (not old.why or time.monotonic() < old.again_at):
            # Unchanged; a refusal that may not last is looked at again on its own schedule,
            # not at every event another entry raises.
            return
        self._forget(name)
        uid, where = st.st_uid, printable(os.path.join(self.path, name))
        if problem is not None:
            self.warnings.warn(uid, f"{noun} {where}: refused: {problem}")
            if self._strays[uid] < MAX_STRAYS_PER_UID:
                self._remember(name, _Entry(uid, sig, None, stray=True))
            return
        if self._held[uid] >= MAX_PER_UID:
            # Neither read nor remembered: looked at again at the next whole listing (the
            # periodic reconcile, a start, `exitwatch reap`), or when it changes.
            self.warnings.warn(
                uid, f"{noun} {where}: refused: uid {uid} has more than {MAX_PER_UID} {noun}s"
            )
            return
        try:
            opened = read_entry(self.fmt, self.kind, dir_fd, name)
        except FileNotFoundError:  # an empty entry directory: being removed, or cancelled
            self._remember(name, _Entry(uid, sig, None, stray=False))
            return
        except EntryError as err:
            if err.lasting or old is None or old.why != str(err):
                self.warnings.warn(uid, f"{noun} {where}: refused: {err}")
            why, tries = ("", 0) if err.lasting else (str(err), _tries(old, str(err)) + 1)
            again_at = time.monotonic() + min(AGAIN_MAX, AGAIN_FIRST * 2 ** (tries - 1))
            self._remember(name, _Entry(uid, sig, None, False, why, again_at, tries))
            return
        opened.close()
        self._remember(name, _Entry(uid, sig, opened.entry, stray=False))

    def _remember(self, name: str, entry: _Entry) -> None:
        self._entries[name] = entry
        (self._strays if entry.stray else self._held)[entry.uid] += 1

    def _forget(self, name: str) -> None:
        entry = self._entries.pop(name, None)
        if entry is None:
            return
        counts = self._strays if entry.stray else self._held
        counts[entry.uid] -= 1
        if not counts[entry.uid]:
            del counts[entry.uid]


def _tries(old: _Entry | None, why: str) -> int:
    """How many looks in a row found the refusal `why`."""
    return old.tries if old is not None and old.why == why else 0


def _sig(st: os.stat_result) -> tuple[int, ...]:
    """What changes when an entry does (read again only then)."""
    return (st.st_dev, st.st_ino, st.st_mode, st.st_uid, st.st_nlink, st.st_size, st.st_mtime_ns)
