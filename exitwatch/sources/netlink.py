"""Exit hints from the kernel proc connector (NETLINK_CONNECTOR, group CN_IDX_PROC).

The protocol is three small structs, so it is spoken with the stdlib `socket` module.
On Linux >= 6.6 the subscription carries an event filter and the kernel sends exits only;
older kernels send every proc event and the reader drops what is not an exit.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import select
import socket
import struct
import threading
import time
from collections.abc import Container

from exitwatch import procfs, shutdown
from exitwatch.owner import Owner
from exitwatch.sources.base import Emit, Exit, Lost, Source, SourceError, name_os_thread

log = logging.getLogger(__name__)

NETLINK_CONNECTOR = 11
CN_IDX_PROC = 1
CN_VAL_PROC = 1
NLMSG_DONE = 3
NLMSG_HDRLEN = 16
PROC_CN_MCAST_LISTEN = 1
PROC_CN_MCAST_IGNORE = 2
PROC_EVENT_EXIT = 0x80000000
# asm-generic value; 32 is SO_SNDBUFFORCE. The socket module does not export either.
SO_RCVBUFFORCE = 33
CAP_NET_ADMIN = 12

DEFAULT_RCVBUF = 16 * 1024 * 1024
# Tests force a tiny buffer on an agent process to provoke ENOBUFS and its resync.
RCVBUF_ENV = "EXITWATCH_NETLINK_RCVBUF"
RECV_SIZE = 16 * 1024
BACKOFF_MIN = 0.1
BACKOFF_MAX = 5.0
NLMSG_NOOP = 1

_NLMSG = struct.Struct("=IHHII")  # len, type, flags, seq, port id
_CN_MSG = struct.Struct("=IIIIHH")  # idx, val, seq, ack, len, flags
# nlmsghdr(16) + cn_msg(20) + proc_event{what @36, cpu, timestamp, event_data @52}.
# exit data: process_pid @52, process_tgid @56, exit_code @60 (raw wait status).
_HEAD = struct.Struct("=I32xI16xI")  # nlmsg_len, what, process_tgid
_STATUS = struct.Struct("=I")
_STATUS_AT = 60
_EVENT_MIN = _STATUS_AT + _STATUS.size


def default_rcvbuf() -> int:
    """DEFAULT_RCVBUF, or the byte count in $EXITWATCH_NETLINK_RCVBUF (a warning if bad)."""
    text = os.environ.get(RCVBUF_ENV)
    if text is None:
        return DEFAULT_RCVBUF
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        log.warning(
            "%s=%r is not a positive byte count; using %d", RCVBUF_ENV, text, DEFAULT_RCVBUF
        )
        return DEFAULT_RCVBUF
    return value


def exit_filter_supported(release: str | None = None) -> bool:
    """Whether the kernel honours the 8-byte subscription that filters events (Linux >= 6.6).

    An older kernel ignores an 8-byte payload without an error, so this is decided by
    version rather than by trying.
    """
    m = re.match(r"(\d+)\.(\d+)", os.uname().release if release is None else release)
    return m is not None and (int(m[1]), int(m[2])) >= (6, 6)


def control_message(op: int, exit_only: bool) -> bytes:
    """The netlink datagram that (un)subscribes from proc events."""
    payload = struct.pack("=II", op, PROC_EVENT_EXIT) if exit_only else struct.pack("=I", op)
    cn = _CN_MSG.pack(CN_IDX_PROC, CN_VAL_PROC, 0, 0, len(payload), 0) + payload
    return _NLMSG.pack(NLMSG_HDRLEN + len(cn), NLMSG_DONE, 0, 0, 0) + cn


def deliver(
    buf: bytes | bytearray | memoryview, n: int, watched: Container[int], emit: Emit
) -> None:
    """Emit an Exit for each exit event of a watched tgid in the first `n` bytes of `buf`.

    Thread exits (pid != tgid) count too: when a leader exits before its threads, only the
    last thread's exit says the process is gone.
    """
    off = 0
    while n - off >= _EVENT_MIN:
        length, what, tgid = _HEAD.unpack_from(buf, off)
        if what == PROC_EVENT_EXIT and tgid in watched:
            (status,) = _STATUS.unpack_from(buf, off + _STATUS_AT)
            emit(Exit(pid=tgid, status=status, at=time.monotonic()))
        if length < NLMSG_HDRLEN:
            return  # malformed; stepping by it would never end
        off += (length + 3) & ~3


def problem() -> str | None:
    """Why the proc connector cannot work for this process, or None if it may."""
    euid = os.geteuid()
    if euid != 0:
        return f"not root (euid {euid})"
    caps = 0
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    caps = int(line.split()[1], 16)
        # The kernel ignores subscriptions from other namespaces without a word.
        foreign = procfs.foreign_namespace("pid", "user")
    except (OSError, ValueError) as err:
        return f"cannot read this process's capabilities and namespaces from /proc: {err}"
    if not caps >> CAP_NET_ADMIN & 1:
        return "no CAP_NET_ADMIN in the effective capability set"
    if foreign == "pid":
        return "not in the host's pid namespace (the proc connector reports host pids only)"
    if foreign == "user":
        return "not in the host's user namespace"
    return None


def feature() -> str:
    """What the kernel will send, for the reason the picker logs."""
    if exit_filter_supported():
        return "exit-only filter"
    return f"all proc events, filtered in user space (kernel {os.uname().release} < 6.6)"


def _explain(err: OSError, step: str) -> str:
    if err.errno in (errno.EPROTONOSUPPORT, errno.EAFNOSUPPORT):
        return (
            f"no proc connector in this kernel ({step}: {err.strerror}): use a kernel with "
            "CONFIG_PROC_EVENTS, or --source poll"
        )
    if err.errno in (errno.EPERM, errno.EACCES):
        return (
            f"not allowed to join the proc connector ({step}: {err.strerror}): run as root "
            "in the host's network namespace, or --source poll"
        )
    return f"proc connector {step} failed: {err.strerror or err}"


def open_socket(rcvbuf: int, exit_only: bool) -> socket.socket:
    """A subscribed connector socket. Raises SourceError saying which step failed."""
    step = "socket"
    try:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_CONNECTOR)
    except OSError as err:
        raise SourceError(_explain(err, step)) from err
    try:
        try:
            step = "SO_RCVBUFFORCE"
            sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, rcvbuf)
        except PermissionError:
            # Without CAP_NET_ADMIN the buffer is capped at net.core.rmem_max.
            step = "SO_RCVBUF"
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        step = "bind"
        sock.bind((0, 1 << (CN_IDX_PROC - 1)))
        step = "subscribe"
        sock.send(control_message(PROC_CN_MCAST_LISTEN, exit_only))
    except OSError as err:
        sock.close()
        raise SourceError(_explain(err, step)) from err
    return sock


class NetlinkSource(Source):
    """Reads proc connector exit events in its own thread; emits those of watched tgids."""

    name = "netlink"

    def __init__(self, rcvbuf: int | None = None, exit_only: bool | None = None) -> None:
        """`rcvbuf` None is default_rcvbuf(); `exit_only` None asks the kernel for exits
        only where it can filter (>= 6.6)."""
        self.rcvbuf = default_rcvbuf() if rcvbuf is None else rcvbuf
        self.exit_only = exit_filter_supported() if exit_only is None else exit_only
        self.lost = 0  # ENOBUFS count: times the kernel dropped events for us
        self._owners: set[Owner] = set()
        # pid -> number of watched owners with that pid. The reader thread only does
        # `tgid in self._pids`, which is safe against concurrent updates under the GIL.
        self._pids: dict[int, int] = {}
        self._lock = threading.Lock()
        self._wake = -1  # eventfd that stop() writes to, for the reader's backoff sleeps
        self._sock: socket.socket | None = None  # the one the reader blocks on now
        self._thread: threading.Thread | None = None
        self._stopped = False

    def start(self, emit: Emit) -> None:
        sock = open_socket(self.rcvbuf, self.exit_only)
        self._wake = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        self._thread = threading.Thread(
            target=self._run, args=(sock, emit), name="exitwatch-netlink", daemon=True
        )
        self._thread.start()

    def watch(self, owner: Owner) -> None:
        with self._lock:
            if owner not in self._owners:
                self._owners.add(owner)
                self._pids[owner.pid] = self._pids.get(owner.pid, 0) + 1

    def unwatch(self, owner: Owner) -> None:
        with self._lock:
            if owner in self._owners:
                self._owners.discard(owner)
                left = self._pids[owner.pid] - 1
                if left:
                    self._pids[owner.pid] = left
                else:
                    del self._pids[owner.pid]

    def stop(self) -> None:
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            sock = self._sock
        if self._thread is not None:
            os.eventfd_write(self._wake, 1)
            if sock is not None:
                _poke(sock)
            self._thread.join(shutdown.PART)
            if self._thread.is_alive():
                log.warning("netlink reader did not stop within %.0f s", shutdown.PART)
            else:
                os.close(self._wake)

    def _run(self, sock: socket.socket, emit: Emit) -> None:
        name_os_thread(f"ew-{self.name}")
        delay = BACKOFF_MIN
        gap: str | None = None
        while True:
            opened = time.monotonic()
            try:
                if gap is not None:
                    # Only now, with the new subscription live, can a re-check cover the gap.
                    emit(Lost(gap))
                self._serve(sock, emit)
                self._close(sock)
                return
            except OSError as err:
                gap = f"netlink socket failed: {err.strerror or err}"
                log.warning("%s; reopening", gap)
            except Exception:
                gap = "netlink reader failed"
                log.exception("%s; reopening", gap)
            self._close(sock)
            if time.monotonic() - opened > BACKOFF_MAX:
                delay = BACKOFF_MIN
            reopened, delay = self._reopen(delay)
            if reopened is None:
                return
            sock = reopened

    def _reopen(self, delay: float) -> tuple[socket.socket | None, float]:
        """Open a new subscribed socket, backing off between tries. None once stopped."""
        while not self._sleep(delay):
            delay = min(delay * 2, BACKOFF_MAX)
            try:
                return open_socket(self.rcvbuf, self.exit_only), delay
            except SourceError as err:
                log.warning("netlink: %s; retrying in %.1f s", err, delay)
        return None, delay

    def _sleep(self, seconds: float) -> bool:
        """Wait up to `seconds`; True if stop() was called."""
        ready, _, _ = select.select([self._wake], [], [], seconds)
        return bool(ready)

    def _serve(self, sock: socket.socket, emit: Emit) -> None:
        """Read until stop() is called. Raises OSError for anything but ENOBUFS."""
        with self._lock:
            self._sock = sock
            if self._stopped:
                return
        buf = bytearray(RECV_SIZE)
        recv_into = sock.recv_into
        watched = self._pids
        # One blocking recv per datagram, as the C floor does: a poll() beside it would
        # double the system calls per exit. stop() wakes it with a datagram of its own;
        # only CAP_NET_ADMIN may unicast to a connector socket, and a forged exit is a hint
        # that /proc must confirm anyway.
        while True:
            try:
                n = recv_into(buf)
            except OSError as err:
                if err.errno != errno.ENOBUFS:
                    raise
                self.lost += 1
                emit(Lost("netlink receive buffer overflowed (ENOBUFS)"))
                continue
            if self._stopped:
                return
            self.events_seen += 1
            deliver(buf, n, watched, emit)

    def _close(self, sock: socket.socket) -> None:
        with self._lock:
            self._sock = None
        try:
            sock.send(control_message(PROC_CN_MCAST_IGNORE, self.exit_only))
        except OSError as err:
            # The socket may be what failed; closing it is all that matters now.
            log.debug("netlink unsubscribe failed: %s", err)
        sock.close()


def _poke(sock: socket.socket) -> None:
    """Wake a reader blocked on `sock` with a no-op datagram, sent from a socket of our own
    to its port: netlink lets one user-space socket unicast to another."""
    try:
        port = sock.getsockname()[0]
        with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_CONNECTOR) as poker:
            # Never wait: a full receive queue means the reader has datagrams to wake it.
            noop = _NLMSG.pack(NLMSG_HDRLEN, NLMSG_NOOP, 0, 0, 0)
            poker.sendto(noop, socket.MSG_DONTWAIT, (port, 0))
    except OSError as err:  # the reader's socket just failed, or is full: it wakes anyway
        log.debug("netlink: cannot wake the reader: %s", err)
