"""`exitwatch adopt`'s policy: the owner of a connection, found from the process at its other
end, which the kernel names (SO_PEERCRED: its pid as the host sees it, even for a client
inside a container).

From the client up through its ancestors, the first process whose command line (its
arguments joined by single spaces) matches one of the rules (fnmatch patterns) is the owner.
In a pid namespace other than the host's (a container), the walk stays in that namespace,
and with no match the owner is the namespace's init (its last NSpid is 1): `docker kill`,
an OOM kill, a crash and `docker restart` all end it. A process entered into the container
from outside (`docker exec`) has a parent outside it: its init is the one the engine names
for the container of its cgroup. On the host, a client that no rule matches is nobody's,
and passes through untouched. Where the owner cannot be found for sure, the connection's
creations are refused (Refuse), never passed on unlabelled.

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
from exitwatch.engine.errors import EngineRefused
from exitwatch.engine.oneshot import OneShot
from exitwatch.engine.url import Endpoint
from exitwatch.owner import current_boot_id
from exitwatch.proxy.policy import Owned, Owner, Refuse

log = logging.getLogger(__name__)

SO_PEERPIDFD = 77  # Linux 6.5; Python 3.11's socket module does not name it
CMDLINE_MAX = 64 * 1024  # bytes of a command line matched against the rules, at most
NAME_MAX = 200  # characters of a command line on the label exitwatch.owner-name
CACHED = 4096  # processes whose namespace depth is remembered (per pid and start time)
CONTAINERS = 1024  # containers whose name and init are remembered
MAX_WALK = 4096  # ancestors walked at most: no process tree is this deep
REREADS = 3  # times a process is read again when its parent dies under the walk
INSPECT_TIMEOUT = 5.0  # seconds for the engine to say which container a cgroup is
# A Docker container's id in a cgroup path: /docker/ID (cgroupfs), docker-ID.scope (systemd).
_CONTAINER_ID = re.compile(r"(?:^|[/-])([0-9a-f]{64})(?:\.scope)?$", re.M)


class _Unknown(Exception):
    """The owner cannot be found for sure; the message says why, in one line."""


@dataclass(frozen=True)
class _Proc:
    pid: int  # as the host sees it
    start: int  # clock ticks after boot
    ppid: int
    depth: int  # of its pid namespace: 1 for the host's
    inner: int  # its pid in its own namespace: 1 for an init
    line: str  # its command line


@dataclass(frozen=True)
class _Container:
    name: str
    init: int  # host pid of its init, 0 when it is not running
    init_start: int


class Adopting:
    """The owner of each connection by its client process, as the module says, for the
    engine at `engine` (which names containers). Thread-safe: connections are served at
    once."""

    def __init__(self, rules: Iterable[str], engine: Endpoint, proc: str = procfs.PROC) -> None:
        self.rules = tuple(rules)
        self._match = re.compile("|".join(fnmatch.translate(r) for r in self.rules) or r"(?!)")
        self._engine, self._proc = OneShot(engine, INSPECT_TIMEOUT), proc
        self._lock = threading.Lock()
        self._depths: collections.OrderedDict[tuple[int, int], tuple[int, int]] = (
            collections.OrderedDict()
        )
        self._containers: collections.OrderedDict[str, _Container] = collections.OrderedDict()
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
        except _Unknown as why:
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
                return self._owned(me, client, matched=True)
            if client.depth > 1 and me.inner == 1:
                return self._owned(me, client, matched=False)
            if me.ppid == 0:  # the host's init (or kthreadd)
                break
            me, parent = self._parent(me)
            if parent.depth != client.depth:  # entered from outside: `docker exec`
                break
            me = parent
        else:
            raise _Unknown(f"the client (pid {pid}) has more than {MAX_WALK} ancestors")
        if client.depth == 1:
            return None
        return self._owned(self._entered(client), client, matched=False)

    def _read(self, pid: int) -> _Proc:
        """One process, as the walk needs it. Its namespace never changes: remembered."""
        st = procfs.read_stat(pid, self._proc)
        line = " ".join(
            a.decode("utf-8", "replace") for a in procfs.cmdline(pid, CMDLINE_MAX, self._proc)
        )
        key = (pid, st.starttime)
        with self._lock:
            depth = self._depths.get(key)
            if depth is not None:
                self._depths.move_to_end(key)
        if depth is None:
            ns = procfs.nspid(pid, self._proc)
            depth = (len(ns), ns[-1])
            with self._lock:
                self._depths[key] = depth
                if len(self._depths) > CACHED:
                    self._depths.popitem(last=False)
        return _Proc(pid, st.starttime, st.ppid, depth[0], depth[1], line)

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

    def _entered(self, client: _Proc) -> _Proc:
        """The init of the container that `client` was entered into from outside: the
        engine's for the container its cgroup names."""
        why = f"pid {client.pid} was entered into its pid namespace from outside (docker exec)"
        found = self._container(client.pid, fresh=True)
        if found is None or not found.init:
            raise _Unknown(f"{why}, and no running container of this engine holds it")
        try:
            init = self._read(found.init)
        except ProcessLookupError:
            raise _Unknown(f"{why}, and its container's init has just ended") from None
        if (init.start, init.depth, init.inner) != (found.init_start, client.depth, 1):
            raise _Unknown(f"{why}, and its container's init is not in its namespace")
        return init

    # -- the owner found ------------------------------------------------------------------------

    def _owned(self, owner: _Proc, client: _Proc, matched: bool) -> Owned:
        """`owner`'s owner string, with what it is: for a container's init, the container's
        name; for a rule's match, its program and the rule (and its container, if in one),
        never its arguments, which may hold a secret, and a label is seen by many."""
        text = f"{current_boot_id()}:{owner.pid}:{owner.start}"
        container = None
        if client.depth > 1:
            with contextlib.suppress(OSError):  # the name is for people: the owner stands alone
                container = self._container(owner.pid, fresh=False)
        where = f"container {container.name}" if container and container.name else ""
        if not matched:
            return Owned(text, where)
        rule = next((r for r in self.rules if fnmatch.fnmatchcase(owner.line, r)), "?")
        program = os.path.basename(owner.line.split(" ", 1)[0])[:NAME_MAX]
        what = f"{program} (rule {rule})"
        return Owned(text, f"{where}: {what}" if where else what)

    def _container(self, pid: int, fresh: bool) -> _Container | None:
        """The container of this engine's whose cgroup holds `pid`, or None. Remembered by
        its id; `fresh` asks the engine again, for an init that a restart may have changed."""
        ids = _CONTAINER_ID.findall(procfs.cgroup(pid, self._proc))
        if not ids:
            return None
        cid = ids[-1]
        with self._lock:
            known = self._containers.get(cid)
        if known is not None and not fresh:
            return known
        try:
            doc = self._engine.inspect(cid)
        except EngineRefused:  # no such container (or none the engine would say)
            doc = {}
        except (OSError, ValueError) as err:
            log.debug("container %s: %s", cid[:12], err)
            return known
        if not isinstance(doc, dict) or not isinstance(doc.get("State"), dict):
            return None
        init = doc["State"].get("Pid") or 0
        start = 0
        if isinstance(init, int) and init > 0:
            try:
                start = procfs.read_stat(init, self._proc).starttime
            except ProcessLookupError:
                init = 0
        found = _Container(str(doc.get("Name", "")).lstrip("/"), init, start)
        with self._lock:
            self._containers[cid] = found
            self._containers.move_to_end(cid)
            if len(self._containers) > CONTAINERS:
                self._containers.popitem(last=False)
        return found

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
