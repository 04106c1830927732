"""`exitwatch adopt`'s policy: the owner of a connection, found from the process at its other
end, which the kernel names (SO_PEERCRED: its pid as the host sees it, even for a client
inside a container).

From the client up through its ancestors, the first process whose command line (its
arguments joined by single spaces) matches one of the rules (fnmatch patterns) is the owner.
In a pid namespace other than the host's (a container), the walk stays in that namespace,
and with no match the owner is the namespace's init (its last NSpid is 1) if its container
is meant to own (containers.py: a label or an operator's pattern says so): `docker kill`,
an OOM kill, a crash and `docker restart` all end it. A process entered into the container
from outside (`docker exec`) has a parent outside it: its init is the one the engine names
for the container of its cgroup. A client in the host's pid namespace whose cgroup is an
owner container's (`--pid=host`) is that container's too, by the same init. Any other
client that no rule matches is nobody's, and passes through untouched, but for one left in
the process group of a dead owner that led it (its orphans): their creations are refused.
Where the owner cannot be found for sure, the connection's creations are refused (Refuse),
never passed on unlabelled.

Everything read here is readable by any user (stat, status, cmdline, cgroup): no ptrace
access is needed. The client is pinned by a pidfd (the peer's own with SO_PEERPIDFD, Linux
6.5; else one opened by pid), and trusted only if it is still alive once all is read.
"""

from __future__ import annotations

import collections
import contextlib
import fnmatch
import logging
import os
import re
import select
import socket
import struct
import threading
from collections.abc import Iterable
from dataclasses import dataclass

from exitwatch import procfs
from exitwatch.adopt.containers import Container, Containers, Unanswered
from exitwatch.contract import ADOPT_OWNER, LABEL_ADOPT
from exitwatch.engine.url import Endpoint
from exitwatch.owner import Owner as Identity
from exitwatch.owner import current_boot_id, current_machine_id
from exitwatch.proxy.policy import Owned, Owner, Refuse

log = logging.getLogger(__name__)

SO_PEERPIDFD = 77  # Linux 6.5; Python 3.11's socket module does not name it
CMDLINE_MAX = 64 * 1024  # bytes of a command line matched against the rules, at most
NAME_MAX = 200  # characters of a command line on the label exitwatch.owner-name
CACHED = 4096  # processes read (per pid, start time and exec) whose reading is remembered
LEADERS = 4096  # rule-matched owners that lead their process group, remembered
MAX_WALK = 4096  # ancestors walked at most: no process tree is this deep
REREADS = 3  # times a process is read again when its parent dies under the walk


class _Unknown(Exception):
    """The owner cannot be found for sure; the message says why, in one line."""


class _Orphan(Exception):
    """The client is a dead owner's orphan; the message says why, in one line."""


@dataclass(frozen=True)
class _Proc:
    pid: int  # as the host sees it
    start: int  # clock ticks after boot
    ppid: int
    pgrp: int  # its process group, as the host sees it
    depth: int  # of its pid namespace: 1 for the host's
    inner: int  # its pid in its own namespace: 1 for an init
    line: str  # its command line


class Adopting:
    """The owner of each connection by its client process, as the module says, for the
    engine at `engine` (which names containers). Thread-safe: connections are served at
    once."""

    def __init__(
        self,
        rules: Iterable[str],
        engine: Endpoint,
        proc: str = procfs.PROC,
        containers: Iterable[str] = (),
    ) -> None:
        self.rules = tuple(rules)
        self._match = re.compile("|".join(fnmatch.translate(r) for r in self.rules) or r"(?!)")
        self._proc = proc
        self.containers = Containers(engine, containers, proc)
        self._lock = threading.Lock()
        self._boot, self._machine = current_boot_id(), current_machine_id()
        # What never changes within one exec of one process: its pid namespace (depth, and
        # its pid there) and its command line, by (pid, start time, environment area: a new
        # one at every exec). Without the area (no ptrace access), the command line is read.
        self._known: collections.OrderedDict[tuple[int, ...], tuple[int, int, str]] = (
            collections.OrderedDict()
        )
        # Rule-matched host owners that lead their process group: pgid -> (start, program).
        self._leaders: collections.OrderedDict[int, tuple[int, str]] = collections.OrderedDict()
        self._told: collections.OrderedDict[str, None] = collections.OrderedDict()

    def owner_for(self, client: socket.socket) -> Owner:
        pid = struct.unpack("3i", client.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
        if pid <= 0:
            return Refuse("the client's process cannot be seen from the host's pid namespace")
        try:
            pidfd = _pin(client, pid)
        except ProcessLookupError:
            return Refuse(f"the client (pid {pid}) exited before its owner could be found")
        try:
            found = self.identify(pid)
            if _exited(pidfd):
                # What was read may be of another process that took its pid since.
                return Refuse(f"the client (pid {pid}) exited before its owner could be found")
        except (_Unknown, _Orphan) as why:
            return Refuse(str(why))
        except ProcessLookupError:
            return Refuse(f"the client (pid {pid}) exited before its owner could be found")
        except OSError as err:
            return Refuse(f"/proc could not be read for pid {pid}: {err.strerror or err}")
        finally:
            os.close(pidfd)
        if found is not None:
            self._tell(found, pid)
        return found

    # -- the walk -------------------------------------------------------------------------------

    def identify(self, pid: int) -> Owned | None:
        """The owner of the client process `pid` (None: nobody's). Raises _Unknown,
        ProcessLookupError when the client is gone, OSError when /proc cannot be read."""
        client = me = self._read(pid)
        for _ in range(MAX_WALK):
            if self._match.fullmatch(me.line):
                if client.depth == 1 and me.pgrp == me.pid:
                    self._lead(me)
                return self._owned(me, client, matched=True)
            if client.depth > 1 and me.inner == 1:
                return self._of_container(me, client, self._holding(me.pid, fresh=False))
            if me.ppid == 0:  # the host's init (or kthreadd)
                break
            me, parent = self._parent(me)
            if parent.depth != client.depth:  # entered from outside: `docker exec`
                break
            me = parent
        else:
            raise _Unknown(f"the client (pid {pid}) has more than {MAX_WALK} ancestors")
        if client.depth == 1:
            return self._on_host(client)
        init, found = self._entered(client)
        return self._of_container(init, client, found)

    def _holding(self, pid: int, fresh: bool) -> Container | None:
        try:
            return self.containers.holding(pid, fresh)
        except Unanswered as err:
            raise _Unknown(f"pid {pid} is in a container, and {err}") from None

    def _of_container(self, init: _Proc, client: _Proc, found: Container | None) -> Owned | None:
        """The owner of a client of the container `found`, whose init is `init`: that init
        if the container is meant to own, else nobody."""
        if found is None or not found.owner:
            if found is not None:
                self._passing(found)
            return None
        return self._owned(init, client, matched=False)

    def _on_host(self, client: _Proc) -> Owned | None:
        """A host pid namespace's client that no rule matches: its container's (one started
        with --pid=host, known by its cgroup) if that is an owner; else nobody's, but for a
        dead leader's orphan (_orphan)."""
        self._orphan(client)
        found = self._holding(client.pid, fresh=False)
        if found is None or not found.owner:
            return None
        init = self._init(found)
        if init is None:
            found = self._holding(client.pid, fresh=True)  # restarted since remembered
            init = self._init(found) if found is not None else None
        if found is None or init is None:
            why = f"pid {client.pid} is in a container started with --pid=host"
            raise _Unknown(f"{why}, and its container's init is not running")
        return self._of_container(init, client, found)

    def _init(self, found: Container) -> _Proc | None:
        """The container's init as the engine named it, if it still is that process."""
        if not found.init:
            return None
        try:
            init = self._read(found.init)
        except ProcessLookupError:
            return None
        return init if init.start == found.init_start else None

    def _lead(self, owner: _Proc) -> None:
        """Remember a rule-matched host owner that leads its process group: what is left in
        the group once it died is its orphans (_orphan)."""
        with self._lock:
            # Its program alone: an answer or a log line carries none of its arguments.
            program = os.path.basename(owner.line.split(" ", 1)[0])[:NAME_MAX]
            self._leaders[owner.pid] = (owner.start, program)
            self._leaders.move_to_end(owner.pid)
            if len(self._leaders) > LEADERS:
                self._leaders.popitem(last=False)

    def _orphan(self, client: _Proc) -> None:
        """Raise _Orphan when `client` is left in the process group of a rule-matched owner
        that led it and has died (its children, reparented to init, and theirs): a dead
        owner's leftovers may not create what nobody would reap."""
        if client.pgrp == client.pid:
            return
        with self._lock:
            leader = self._leaders.get(client.pgrp)
        if leader is None or client.start < leader[0]:
            return
        try:
            alive = procfs.read_stat(client.pgrp, self._proc).starttime == leader[0]
        except ProcessLookupError:
            alive = False
        if not alive:
            raise _Orphan(
                f"pid {client.pid} is left in the process group of owner {client.pgrp} "
                f"({leader[1]!r}), which has died: a dead owner's orphans may not create"
            )

    def _read(self, pid: int) -> _Proc:
        """One process, as the walk needs it: its parent and group read each time (a parent
        may die and leave it to another); the rest remembered for the exec it is in."""
        start, env_start, env_end, ppid, pgrp = procfs.lineage(pid, self._proc)
        key = (pid, start, env_start, env_end)
        with self._lock:
            known = self._known.get(key)
            if known is not None:
                self._known.move_to_end(key)
        if known is None or not env_end:
            args = procfs.cmdline(pid, CMDLINE_MAX, self._proc)
            line = " ".join(a.decode("utf-8", "replace") for a in args)
            if known is None:
                ns = procfs.nspid(pid, self._proc)
                known = (len(ns), ns[-1], line)
            else:
                known = (known[0], known[1], line)
            # Read after the command line: an exec in between has a new area, and the
            # reading is then remembered under a key no later read will find.
            if procfs.lineage(pid, self._proc)[:3] != (start, env_start, env_end):
                key = ()
            with self._lock:
                if key:
                    self._known[key] = known
                    if len(self._known) > CACHED:
                        self._known.popitem(last=False)
        return _Proc(pid, start, ppid, pgrp, known[0], known[1], known[2])

    def _parent(self, me: _Proc) -> tuple[_Proc, _Proc]:
        """(me as it is now, its parent). A parent that died under the walk left `me` to
        another (a subreaper, the namespace's init): `me` is read again for it."""
        for _ in range(REREADS):
            try:
                parent = self._read(me.ppid)
            except ProcessLookupError:
                parent = None
            if parent is not None and parent.start <= me.start:
                return me, parent
            # Gone, or its pid is a younger process's now, which cannot be me's parent.
            again = self._read(me.pid)
            if again.start != me.start:
                raise ProcessLookupError(me.pid)
            me = again
        raise _Unknown(f"the parent of pid {me.pid} kept changing while it was looked up")

    def _entered(self, client: _Proc) -> tuple[_Proc, Container]:
        """The init of the container that `client` was entered into from outside, and that
        container: the engine's for the container its cgroup names."""
        why = f"pid {client.pid} was entered into its pid namespace from outside (docker exec)"
        found = self._holding(client.pid, fresh=True)
        if found is None or not found.init:
            raise _Unknown(f"{why}, and no running container of this engine holds it")
        try:
            init = self._read(found.init)
        except ProcessLookupError:
            raise _Unknown(f"{why}, and its container's init has just ended") from None
        if (init.start, init.depth, init.inner) != (found.init_start, client.depth, 1):
            raise _Unknown(f"{why}, and its container's init is not in its namespace")
        return init, found

    # -- the owner found ------------------------------------------------------------------------

    def _owned(self, owner: _Proc, client: _Proc, matched: bool) -> Owned:
        """`owner`'s owner string, with what it is: for a container's init, the container's
        name; for a rule's match, its program and the rule (and its container, if in one),
        never its arguments, which may hold a secret, and a label is seen by many."""
        text = str(Identity(self._boot, owner.pid, owner.start, self._machine))
        container = None
        if client.depth > 1 or not matched:  # not matched: a container's init
            with contextlib.suppress(OSError):  # the name is for people: the owner stands alone
                container = self._container(owner.pid, fresh=False)
        where = f"container {container.name}" if container and container.name else ""
        if not matched:
            return Owned(text, where)
        rule = next((r for r in self.rules if fnmatch.fnmatchcase(owner.line, r)), "?")
        program = os.path.basename(owner.line.split(" ", 1)[0])[:NAME_MAX]
        what = f"{program} (rule {rule})"
        return Owned(text, f"{where}: {what}" if where else what)

    def _container(self, pid: int, fresh: bool) -> Container | None:
        """The container of this engine's whose cgroup holds `pid` (containers.py)."""
        return self.containers.holding(pid, fresh)

    def _passing(self, found: Container) -> None:
        """Say once (while remembered) that a container's clients pass through: a runner
        container that should own lacks its opt-in."""
        key = f"passing {found.name}"
        with self._lock:
            if key in self._told:
                return
            self._told[key] = None
            if len(self._told) > CACHED:
                self._told.popitem(last=False)
        log.info(
            "container %s is no owner (no label %s=%s, no [adopt] containers pattern): "
            "what its clients create passes through unlabelled",
            found.name,
            LABEL_ADOPT,
            ADOPT_OWNER,
        )

    def _tell(self, found: Owned, pid: int) -> None:
        """Log each owner once (while it is remembered), with what it is."""
        with self._lock:
            if found.owner in self._told:
                return
            self._told[found.owner] = None
            if len(self._told) > CACHED:
                self._told.popitem(last=False)
        log.info("owner %s (%s), first seen from pid %d", found.owner, found.name or "-", pid)


def _pin(client: socket.socket, pid: int) -> int:
    """A pidfd of the client: the kernel's own for the peer (SO_PEERPIDFD), else one
    opened by pid, which names the peer unless its pid was reused since connect(), which
    takes the kernel a wrap of the pid space. Raises ProcessLookupError."""
    try:
        return struct.unpack("i", client.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD, 4))[0]
    except OSError:
        pass
    try:
        return os.pidfd_open(pid)
    except (ProcessLookupError, OSError) as err:
        raise ProcessLookupError(pid) from err


def _exited(pidfd: int) -> bool:
    """Whether the process of `pidfd` has exited: its pidfd reads as ready then."""
    poll = select.poll()
    poll.register(pidfd, select.POLLIN)
    return bool(poll.poll(0))
