"""What the kinds whose resources are entries of a spool share: the listing and the
following of the spool (inotify, else whole listings), and the spool made at start. Each
such kind (hooks, leases, watchdogs) brings its Format and what "removal" is for it.
"""

from __future__ import annotations

import functools
import logging
import os
import time

from exitwatch.kinds import discovery, inotify
from exitwatch.kinds.base import Notify, Outcome, Resource, ResourceKind, Snapshot
from exitwatch.kinds.fsops import printable
from exitwatch.kinds.spool.entry import (
    Entry,
    EntryError,
    Format,
    ensure_spool,
    read_entry,
    remove_entry,
    spool_fd,
)
from exitwatch.kinds.spool.listing import Spool

log = logging.getLogger(__name__)

POLL_INTERVAL = 1.0  # seconds between rescans when inotify cannot be used
_SELF_GONE = inotify.IN_DELETE_SELF | inotify.IN_MOVE_SELF | inotify.IN_IGNORED


class SpoolKind(ResourceKind):
    """The entries of one spool directory, as resources of `kind`."""

    fmt: Format

    def __init__(self, path: str) -> None:
        self.path = path
        # Shared by discovery and the scans: one user's entries are remembered (and warned
        # about) once, however often the spool is listed.
        self._spool = Spool(self.fmt, self.kind, path)
        noun = self.fmt.noun
        self._name = f"{noun} discovery"
        self._discovery = discovery.Discovery(self._name, f"exitwatch-{noun}s")

    def scan(self) -> Snapshot:
        """Every entry now. Raises OSError or EntryError when the spool cannot be listed:
        an empty listing would read as every entry gone."""
        found = self._spool.list()
        return Snapshot(self.kind, tuple(found[n] for n in sorted(found)))

    def start(self, notify: Notify) -> None:
        try:
            ensure_spool(self.path)
        except (OSError, EntryError) as err:
            why = err.strerror if isinstance(err, OSError) else str(err)
            noun, where = self.fmt.noun, printable(self.path)
            log.error("%s spool %s: %s; %s", noun, where, why, self.fmt.unusable)
            notify(Snapshot(self.kind, ()))
            return
        self._discovery.start(lambda stop_fd: self._follow(notify, stop_fd))

    def stop(self) -> None:
        self._discovery.stop()

    def _follow(self, notify: Notify, stop_fd: int) -> None:
        """A Snapshot, then Found and Gone as the spool changes: with inotify (_watch),
        else with whole listings every POLL_INTERVAL. A listing that fails is said once
        and tried again every POLL_INTERVAL; what was known stands meanwhile."""
        listing = discovery.Listing(self.kind, notify)
        rescans = discovery.Rescans(
            self._name,
            discovery.every(POLL_INTERVAL),
            log,
            expected=(OSError, EntryError),
            repeat=False,
        )
        discovery.inotify_else_rescans(
            self._name,
            log,
            lambda: self._watch(listing, rescans, stop_fd),
            lambda why: rescans.run(stop_fd, lambda: self._list(listing), listing),
        )

    def _watch(self, listing: discovery.Listing, rescans: discovery.Rescans, stop_fd: int) -> None:
        """With inotify: the names an event gives are looked at again, not the whole spool
        (a change that raises no event, a chmod or one inside an entry's directory, is seen
        at the entry's next event or the next whole listing, and everything is checked
        again before an entry acts); an entry that did not change is never read again."""
        ino = self._inotify()
        try:
            log.info("following %ss in %s with inotify", self.fmt.noun, printable(self.path))
            changed: set[str] | None = None  # None: list the whole spool
            while True:
                if rescans.once(functools.partial(self._list, listing, changed), listing):
                    changed = self._changed(ino, stop_fd)
                elif discovery.wait(stop_fd, None, rescans.next):
                    return
                else:
                    changed = None
        finally:
            ino.close()

    def _inotify(self) -> inotify.Inotify:
        """An inotify instance watching the spool; raises discovery.Fallback."""
        ino = None
        try:
            ino = inotify.Inotify()
            dir_fd = spool_fd(self.path)
            try:
                ino.watch(dir_fd, self.path, 0)
            finally:
                os.close(dir_fd)
            return ino
        except (OSError, EntryError) as err:
            if ino is not None:
                ino.close()
            raise discovery.Fallback(getattr(err, "strerror", None) or str(err)) from None

    def _changed(self, ino: inotify.Inotify, stop_fd: int) -> set[str] | None:
        """Wait for events, or until a refusal that may not last is due another look; the
        names to look at again: set() for the due refusals alone (list() adds them), None
        for the whole spool (events lost, or one without a name). Raises
        discovery.Stopped, or discovery.Fallback when the spool itself went."""
        due = self._spool.next_again()
        timeout = None if due is None else max(0.0, due - time.monotonic())
        if discovery.wait(stop_fd, ino.fd, timeout):
            raise discovery.Stopped
        if due is not None and time.monotonic() >= due:
            return set()
        events = ino.read()
        if any(mask & _SELF_GONE for _, mask, _ in events):
            spool = f"{self.fmt.noun} spool {printable(self.path)}"
            raise discovery.Fallback(f"{spool} was removed or moved")
        changed = {name for _, _, name in events}
        return None if "" in changed else changed

    def _list(
        self, listing: discovery.Listing, changed: set[str] | None = None
    ) -> dict[str, Entry]:
        """Spool.list(changed). When it fails, what the spool knew is forgotten (it may be
        half updated), and if none succeeded yet, an empty listing is told: the agent's
        start, which waits for every kind's first listing, does not wait for this one."""
        try:
            return self._spool.list(changed)
        except Exception:
            self._spool.reset()
            if listing.known is None:
                listing.report({})
            raise

    # -- removal of entries whose owner is dead (leases, watchdogs) -------------------------

    def delete(self, resources: list[Resource], dry_run: bool, done: str) -> list[Outcome]:
        """Delete the entries `resources` of a dead owner: each if it still names that
        owner, and its directory and file are the ones found. `done` says what that means."""
        if dry_run:
            return [
                Outcome.done(self.what(r), self.kind, "would remove", key=r.key) for r in resources
            ]
        try:
            dir_fd = spool_fd(self.path)
        except (OSError, EntryError) as err:
            why = f"failed: spool: {getattr(err, 'strerror', None) or err}"
            return [Outcome.failed(self.what(r), self.kind, why, key=r.key) for r in resources]
        try:
            return [self._delete_one(dir_fd, res, done) for res in resources]
        finally:
            os.close(dir_fd)

    def _delete_one(self, dir_fd: int, res: Resource, done: str) -> Outcome:
        what, kind = self.what(res), self.kind
        try:
            opened = read_entry(self.fmt, kind, dir_fd, res.key)
        except FileNotFoundError:
            return Outcome.done(what, kind, "already gone (cancelled)", key=res.key)
        except EntryError as err:
            return Outcome.refusal(what, kind, str(err), key=res.key)
        try:
            if opened.entry.owner != res.owner:
                why = f"it now names owner {opened.entry.owner}, not {res.owner}"
                return Outcome.refusal(what, kind, why, key=res.key)
            remove_entry(self.fmt, dir_fd, opened)
        except OSError as err:
            return Outcome.failed(what, kind, f"failed: {err.strerror}", key=res.key)
        finally:
            opened.close()
        return Outcome.done(what, kind, done, key=res.key)
