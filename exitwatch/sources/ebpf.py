"""Exit hints from an eBPF program that reports only the watched thread groups' deaths.

exitwatch.bpf.c runs at every exit on the host, but it checks the tgid against its
`watched` map in the kernel, so this process wakes only for owners it asked about. Each
record carries the wait status and the leader's start time, so a consumer can tell a
reused pid from the owner it watched.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import errno
import heapq
import itertools
import logging
import os
import select
import struct
import sys
import threading
import time

from exitwatch import procfs
from exitwatch.owner import Owner, current_boot_id, death
from exitwatch.sources.base import Emit, Exit, Lost, Source, SourceError, name_os_thread
from exitwatch.sources.libbpf import Libbpf, SampleFn

log = logging.getLogger(__name__)

OBJ_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "exitwatch.bpf.o")
BTF_PATH = "/sys/kernel/btf/vmlinux"
PROGRAM = "exitwatch_exit"
DEFAULT_MAX_OWNERS = 65536
# A record takes 24 bytes, so 256 KiB holds about 10,000 deaths not yet read.
DEFAULT_RING_BYTES = 1 << 18

_EVENT = struct.Struct("=IIQ")  # struct event in exitwatch.bpf.c: tgid, status, start ns
_NSEC_PER_SEC = 1_000_000_000
# The program runs in do_exit() before the group turns zombie, so /proc may still call
# it alive for a moment. Such a hint is held and re-checked, quickly at first.
_FIRST_RECHECK = 0.001
_MAX_RECHECK = 0.25


class EbpfSource(Source):
    """Exit hints from exitwatch.bpf.c. `start` it before watching owners.

    Owners that do not fit in the kernel map (`max_owners`) are handed to `fallback`,
    which is started the first time that happens and stopped with this source.
    """

    name = "ebpf"

    def __init__(
        self,
        max_owners: int = DEFAULT_MAX_OWNERS,
        obj_path: str | None = None,
        fallback: Source | None = None,
        ring_bytes: int = DEFAULT_RING_BYTES,
    ) -> None:
        if max_owners < 1:
            raise ValueError(f"max_owners must be at least 1, not {max_owners}")
        page = os.sysconf("SC_PAGE_SIZE")
        if ring_bytes < page or ring_bytes & (ring_bytes - 1):
            raise ValueError(f"ring_bytes must be a power of two >= {page}, not {ring_bytes}")
        self.max_owners = max_owners
        self.obj_path = obj_path or OBJ_PATH
        self.fallback = fallback
        self.ring_bytes = ring_bytes
        # The kernel's nsec_to_clock_t() for the USER_HZ values Linux uses (10**9 % HZ == 0).
        self._ns_per_tick = _NSEC_PER_SEC // os.sysconf("SC_CLK_TCK")
        self._lock = threading.Lock()
        self._lib: Libbpf | None = None
        self._obj = self._link = self._rb = 0
        self._watched_fd = self._lost_fd = -1
        # The ring's callback, made with the ring and dropped with it (_release): libbpf
        # calls it for the ring's whole life, and ctypes frees the C thunk along with the
        # last Python reference. It holds this source (a bound method), so one kept past
        # the ring would leave the pair to the garbage collector, at any moment in any
        # thread; dropped, it goes at once.
        self._on_sample: ctypes._CFuncPtr | None = None
        self._samples: list[tuple[Owner, Exit]] = []  # filled by _sample, in the thread
        # From watch(): (owner, hint, whether it is surely dying) for the thread to re-check.
        self._inbox: collections.deque[tuple[Owner, Exit, bool]] = collections.deque()
        self._owners: dict[int, set[Owner]] = {}  # tgid -> owners watched in the map
        self._overflow: set[Owner] = set()  # owners watched by the fallback
        self._fallback_started = False
        self._wake_r = self._wake_w = -1
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._emit: Emit | None = None
        self._stopped = False

    @property
    def overflowed(self) -> int:
        """How many owners are watched by the fallback because the map was full."""
        with self._lock:
            return len(self._overflow)

    def load(self) -> None:
        """Load and attach the program. Raises SourceError saying why it cannot run here."""
        with self._lock:
            if self._stopped:
                raise SourceError("the ebpf source was stopped")
            if self._obj:
                return
            try:
                self._load()
            except SourceError:
                self._release()
                raise

    def _load(self) -> None:
        if os.geteuid() != 0:
            raise SourceError(f"not root (euid {os.geteuid()})")
        if procfs.foreign_namespace("pid"):
            # The program reports host pids; /proc here would name other processes.
            raise SourceError("not in the host's pid namespace")
        if not os.path.exists(BTF_PATH):
            raise SourceError(
                f"the kernel has no BTF ({BTF_PATH} is missing): use a kernel built with "
                "CONFIG_DEBUG_INFO_BTF, or --source netlink"
            )
        try:
            self._lib = lib = Libbpf()
        except OSError as err:
            raise SourceError(f"libbpf 1.x not found ({err}): install libbpf1") from None
        _check_object(self.obj_path)
        try:
            self._obj = lib.open_object(self.obj_path)
            watched = lib.find_map(self._obj, "watched")
            events = lib.find_map(self._obj, "events")
            lib.set_max_entries(watched, self.max_owners)
            lib.set_max_entries(events, self.ring_bytes)
        except OSError as err:
            raise SourceError(f"cannot open {self.obj_path}: {err.strerror}") from None
        try:
            lib.load_object(self._obj)
        except OSError as err:
            raise SourceError(f"the kernel refused the eBPF program: {err.strerror}") from None
        try:
            self._link = lib.attach(lib.find_program(self._obj, PROGRAM))
        except OSError as err:
            raise SourceError(f"cannot attach to sched_process_exit: {err.strerror}") from None
        try:
            self._watched_fd = lib.map_fd(watched)
            self._lost_fd = lib.map_fd(lib.find_map(self._obj, "lost"))
            self._on_sample = SampleFn(self._sample)
            self._rb = lib.ring_buffer_new(lib.map_fd(events), self._on_sample)
        except OSError as err:
            raise SourceError(f"cannot open the eBPF ring buffer: {err.strerror}") from None

    def start(self, emit: Emit) -> None:
        self.load()
        with self._lock:
            if self._thread is not None:
                raise SourceError("the ebpf source is already started")
            self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
            self._emit = emit
            self._thread = threading.Thread(
                target=self._run, args=(emit,), name="exitwatch-ebpf", daemon=True
            )
            self._thread.start()
        log.info("ebpf source watching up to %d owners in the kernel", self.max_owners)

    def watch(self, owner: Owner) -> None:
        with self._lock:
            if self._emit is None:
                raise SourceError("the ebpf source is not running")
            self._arm(owner)
        # Armed first, then checked: a death before the arming shows in /proc, a death
        # after it reaches the program. Only a group already inside do_exit() can slip
        # between the two, so it is re-checked until /proc agrees. The owner is watched
        # either way: a /proc that cannot be read now (a full fd table) leaves the check
        # to the thread, which makes it once /proc can be read.
        verdict = _verdict(owner, sure=False)
        if verdict == "alive":
            return
        with self._lock:
            if self._emit is not None:  # not stopped meanwhile: the pipe is still open
                hint = Exit(owner.pid, at=time.monotonic())
                self._inbox.append((owner, hint, verdict is not None))
                self._wake()

    def _arm(self, owner: Owner) -> None:
        if owner in self._overflow:
            return
        assert self._lib is not None
        try:
            self._lib.update_u32_u64(self._watched_fd, owner.pid, owner.starttime)
        except OSError as err:
            self._to_fallback(owner, err)
            return
        self._owners.setdefault(owner.pid, set()).add(owner)

    def _to_fallback(self, owner: Owner, err: OSError) -> None:
        # E2BIG is a full map; any other failure still must not leave the owner unwatched.
        why = "map full" if err.errno == errno.E2BIG else err.strerror
        if self.fallback is None:
            raise SourceError(f"cannot watch {owner} in the kernel ({why}) and no fallback")
        if not self._overflow:
            log.warning(
                "ebpf cannot watch more owners in the kernel (%s, max %d); %s watches the rest",
                why,
                self.max_owners,
                self.fallback.name,
            )
        if not self._fallback_started:
            assert self._emit is not None
            self.fallback.start(self._emit)
            self._fallback_started = True
        self.fallback.watch(owner)
        self._overflow.add(owner)

    def unwatch(self, owner: Owner) -> None:
        with self._lock:
            if owner in self._overflow:
                assert self.fallback is not None
                self._overflow.discard(owner)
                self.fallback.unwatch(owner)
                return
            owners = self._owners.get(owner.pid)
            if owners is None or owner not in owners:
                return
            owners.discard(owner)
            if owners:
                return  # another owner with this pid (only one of them can be alive)
            del self._owners[owner.pid]
            assert self._lib is not None
            try:
                self._lib.delete_u32(self._watched_fd, owner.pid)
            except OSError as err:
                # ENOENT: the program already claimed this death.
                if err.errno != errno.ENOENT:
                    log.warning("ebpf cannot unwatch pid %d: %s", owner.pid, err.strerror)

    def stop(self) -> None:
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            self._emit = None
            thread = self._thread
        if thread is not None:
            self._stopping.set()
            self._wake()
            thread.join()
        with self._lock:
            self._release()
        if self._fallback_started:
            assert self.fallback is not None
            self.fallback.stop()

    def _release(self) -> None:
        lib = self._lib
        if lib is not None:
            if self._link:
                lib.destroy_link(self._link)
            if self._rb:
                lib.ring_buffer_free(self._rb)
            if self._obj:
                lib.close_object(self._obj)  # closes the map fds too
        self._obj = self._link = self._rb = 0
        self._on_sample = None  # after the ring that calls it
        self._watched_fd = self._lost_fd = -1
        for fd in (self._wake_r, self._wake_w):
            if fd >= 0:
                os.close(fd)
        self._wake_r = self._wake_w = -1
        self._owners.clear()
        self._overflow.clear()

    def _wake(self) -> None:
        # A full pipe already holds a wake-up.
        with contextlib.suppress(BlockingIOError):
            os.write(self._wake_w, b"\0")

    def _sample(self, _ctx: int | None, data: int, _size: int) -> int:
        tgid, status, start_ns = _EVENT.unpack(ctypes.string_at(data, _EVENT.size))
        ticks = start_ns // self._ns_per_tick
        hint = Exit(tgid, status=status, starttime=ticks, at=time.monotonic())
        self.events_seen += 1
        self._samples.append((Owner(current_boot_id(), tgid, ticks), hint))
        return 0

    def _run(self, emit: Emit) -> None:
        name_os_thread(f"ew-{self.name}")
        assert self._lib is not None
        lib = self._lib
        poller = select.epoll()
        # (due, tiebreak, next delay, owner, hint, surely dying): hints held until /proc
        # shows the death; one not surely dying is dropped once /proc shows it alive.
        held: list[tuple[float, int, float, Owner, Exit, bool]] = []
        tiebreak = itertools.count()
        lost_seen = 0
        try:
            poller.register(lib.ring_buffer_epoll_fd(self._rb), select.EPOLLIN)
            poller.register(self._wake_r, select.EPOLLIN)
            while True:
                timeout = max(0.0, held[0][0] - time.monotonic()) if held else -1
                poller.poll(timeout)
                if self._stopping.is_set():
                    return
                _drain(self._wake_r)
                lib.ring_buffer_consume(self._rb)
                now = time.monotonic()
                fresh = [(owner, hint, True) for owner, hint in self._samples]
                self._samples = []
                while self._inbox:
                    fresh.append(self._inbox.popleft())
                for owner, hint, sure in fresh:
                    heapq.heappush(held, (now, next(tiebreak), _FIRST_RECHECK, owner, hint, sure))
                lost = lib.lookup_u32_u64(self._lost_fd, 0)
                if lost != lost_seen:
                    emit(Lost(f"ebpf ring buffer full, {lost - lost_seen} exits unreported"))
                    self.lost += 1
                    lost_seen = lost
                while held and held[0][0] <= now:
                    _, _, delay, owner, hint, sure = heapq.heappop(held)
                    verdict = _verdict(owner, sure)
                    if verdict == "dead":
                        emit(hint)
                    elif verdict != "alive":  # alive and watched: the program reports it
                        # Still exiting, or /proc cannot be read now: looked at again.
                        again = (now + delay, next(tiebreak), min(delay * 2, _MAX_RECHECK))
                        heapq.heappush(held, (*again, owner, hint, sure or verdict is not None))
        finally:
            poller.close()


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


def _verdict(owner: Owner, sure: bool) -> str | None:
    """The owner as /proc shows it: "dead"; "exiting" while it is on its way (always when
    `sure`: the program saw it exit); "alive"; or None while /proc cannot be read (a full
    fd table), which proves nothing."""
    try:
        if death(owner) is not None:
            return "dead"
        return "exiting" if sure or procfs.group_exiting(owner.pid) else "alive"
    except OSError:
        return None


def _check_object(path: str) -> None:
    """The object is there, and of this host's byte order: the committed one is
    little-endian bytecode (packaging/README.md), which a big-endian kernel would refuse
    with an obscure error, so say it plainly."""
    try:
        with open(path, "rb") as f:
            ident = f.read(6)
    except FileNotFoundError:
        install = "install the exitwatch-bpf package (from a checkout: make bpf)"
        raise SourceError(f"eBPF object {path} is missing: {install}") from None
    except OSError as err:
        raise SourceError(f"cannot read {path}: {err.strerror}") from None
    order = {b"\x01": "little", b"\x02": "big"}.get(ident[5:6]) if ident[:4] == b"\x7fELF" else None
    if order is None:
        raise SourceError(f"cannot open {path}: not an ELF object")
    if order != sys.byteorder:
        raise SourceError(
            f"eBPF object {path} is {order}-endian bytecode and this host is {sys.byteorder}-"
            "endian (install exitwatch-bpf, or rebuild it here: make -B bpf)"
        )


def feature() -> str:
    """What the source does here, for the reason the picker logs."""
    return "in-kernel exit filter on the watched tgids"


def probe(obj_path: str | None = None) -> str | None:
    """None if the ebpf source can run here, else the reason it cannot."""
    source = EbpfSource(max_owners=1, obj_path=obj_path)
    try:
        source.load()
    except SourceError as err:
        return str(err)
    finally:
        source.stop()
    return None
