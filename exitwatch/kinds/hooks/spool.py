"""The hooks in the spool as discovery sees them: listed whole or by the names that
changed, each file read again only when it changed, at most MAX_PER_UID per user."""

from __future__ import annotations

import collections
import errno
import logging
import os

from exitwatch.contract import HOOK_SUFFIX
from exitwatch.kinds.fsops import printable
from exitwatch.kinds.hooks.file import SPOOL_OPEN, Hook, HookError, read_hook

log = logging.getLogger(__name__)

MAX_PER_UID = 1024  # hooks of one user the agent holds; more are refused with a warning


class Spool:
    """The hooks in the spool, read again only when a file changed. One per thread."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._seen: dict[str, tuple[tuple[int, ...], Hook | None]] = {}
        self._found: dict[str, Hook] = {}  # every good hook, before the per-user cap
        self._warned: dict[str, str] = {}  # name: refusal, for refusals not cached in _seen
        self._capped: set[str] = set()  # names left out as over their user's MAX_PER_UID
        self._listed = False  # whether the whole spool was listed since it could not be

    def list(self, changed: set[str] | None = None) -> dict[str, Hook]:
        """The good hooks in the spool: listed whole, or, given the names that changed
        since the last listing, with only those looked at again (and the refusals that
        may not last). Raises OSError when the spool cannot be listed now (EMFILE, EACCES):
        an empty answer would read as every hook gone."""
        try:
            dir_fd = os.open(self.path, SPOOL_OPEN)
        except OSError as err:
            self._listed = False
            if err.errno == errno.ENOENT:  # no spool: truly no hooks
                return {}
            raise OSError(f"hook spool {printable(self.path)}: {err.strerror}") from None
        try:
            if changed is None or not self._listed:
                return self._list(dir_fd)
            for name in changed | self._warned.keys():
                self._look(dir_fd, name)
            return self._cap(self._found)
        finally:
            os.close(dir_fd)

    def _list(self, dir_fd: int) -> dict[str, Hook]:
        try:
            names = set(os.listdir(dir_fd))
        except OSError as err:
            self._listed = False
            raise OSError(f"hook spool {printable(self.path)}: {err.strerror}") from None
        self._listed = True
        for name in (self._seen.keys() | self._found.keys() | self._warned.keys()) - names:
            self._forget(name)
        for name in names:
            self._look(dir_fd, name)
        return self._cap(self._found)

    def _look(self, dir_fd: int, name: str) -> None:
        """Bring what is known of file `name` up to date; it is read again only if it
        changed, or was refused for a reason that may not last."""
        if name.startswith("."):  # a hook being written
            return
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:  # gone
            self._forget(name)
            return
        sig = (st.st_ino, st.st_mode, st.st_uid, st.st_nlink, st.st_size, st.st_mtime_ns)
        old = self._seen.get(name)
        if old is not None and old[0] == sig:
            return
        self._seen.pop(name, None)
        self._found.pop(name, None)
        hook, lasting = self._read(dir_fd, name)
        if lasting:
            self._seen[name] = (sig, hook)
        if hook is not None:
            self._found[name] = hook

    def _forget(self, name: str) -> None:
        self._seen.pop(name, None)
        self._found.pop(name, None)
        self._warned.pop(name, None)

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
