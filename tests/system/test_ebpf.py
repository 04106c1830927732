"""The eBPF exit source against the real kernel, with real processes and signals."""

import gc
import os
import signal
import subprocess
import threading
import time
import weakref

import pytest

from exitwatch import procfs
from exitwatch.owner import Owner, current_boot_id, death, owner_of
from exitwatch.sources import ebpf
from exitwatch.sources.base import Exit, Hint, Lost, SourceError
from exitwatch.sources.ebpf import EbpfSource
from exitwatch.sources.poll import PollSource

from support import procs
from support.procs import wait_for

# A missing object is a broken build, not an unusable host: let the tests fail on it.
REASON = ebpf.probe() if os.path.exists(ebpf.OBJ_PATH) else None
pytestmark = [
    pytest.mark.skipif(REASON is not None, reason=f"eBPF unusable here: {REASON}"),
    pytest.mark.usefixtures("no_leaked_threads"),
]


class Hints:
    """An emit that records every hint, and whether /proc already agreed when it came."""

    def __init__(self) -> None:
        self.all: list[Hint] = []
        self.dead_on_arrival: dict[int, list[bool]] = {}

    def __call__(self, hint: Hint) -> None:
        if isinstance(hint, Exit) and hint.starttime is not None:
            owner = Owner(current_boot_id(), hint.pid, hint.starttime)
            self.dead_on_arrival.setdefault(hint.pid, []).append(death(owner) is not None)
        self.all.append(hint)

    def exits(self, pid: int) -> list[Exit]:
        return [h for h in list(self.all) if isinstance(h, Exit) and h.pid == pid]

    def kernel_exits(self, pid: int) -> list[Exit]:
        """Hints from the program itself (they carry a start time), not from watch()."""
        return [h for h in self.exits(pid) if h.starttime is not None]


@pytest.fixture
def hints():
    return Hints()


@pytest.fixture
def source(hints):
    src = EbpfSource()
    src.start(hints)
    yield src
    src.stop()


@pytest.fixture
def children():
    """Children to clean up whatever the test did to them."""
    made: list[procs.Child] = []
    yield made
    for child in made:
        if child.proc.poll() is None:
            child.proc.kill()
        procs.reap(child)


def owner_child(children, exit_code=0):
    child = procs.spawn_owner(exit_code)
    children.append(child)
    return child


def round_trip(source, hints, children):
    """Kill a fresh watched process and wait for its hint. The ring buffer is in order, so
    a hint the program had produced before this one has been delivered by then."""
    marker = owner_child(children)
    source.watch(marker.owner)
    procs.kill(marker)
    wait_for(lambda: hints.kernel_exits(marker.pid), what=f"the hint for marker {marker.pid}")


def test_sigkill_reports_status_9_and_the_exact_start_time(source, hints, children):
    child = owner_child(children)
    field22 = procfs.read_stat(child.pid).starttime
    source.watch(child.owner)
    procs.kill(child, signal.SIGKILL)
    [hint] = wait_for(lambda: hints.kernel_exits(child.pid), what="the SIGKILL hint")
    assert hint.status == signal.SIGKILL
    assert hint.starttime == field22 == child.owner.starttime
    # Held until /proc shows the death, so the consumer's confirmation cannot miss it.
    assert hints.dead_on_arrival[child.pid] == [True]


def test_exit_3_reports_status_0x300(source, hints, children):
    child = owner_child(children, exit_code=3)
    source.watch(child.owner)
    procs.release(child)
    [hint] = wait_for(lambda: hints.kernel_exits(child.pid), what="the exit(3) hint")
    assert hint.status == 0x300


def test_unwatched_exits_are_not_reported(source, hints, children):
    watched = owner_child(children)
    source.watch(watched.owner)
    procs.fork_storm(200)
    unwatched = [owner_child(children) for _ in range(5)]
    for child in unwatched:
        procs.kill(child)
    procs.kill(watched)
    wait_for(lambda: hints.kernel_exits(watched.pid), what="the watched child's hint")
    assert {h.pid for h in hints.all if isinstance(h, Exit)} == {watched.pid}


def test_main_thread_exiting_first_is_reported_once_at_the_real_death(source, hints, children):
    child = procs.spawn_main_thread_exits_first()
    children.append(child)
    source.watch(child.owner)
    procs.exit_main_thread(child)

    def leader_is_zombie_with_threads():
        stat = procfs.read_stat(child.pid)
        return stat.state == "Z" and stat.num_threads > 1

    wait_for(leader_is_zombie_with_threads, what="the main thread to exit alone")
    round_trip(source, hints, children)
    assert hints.exits(child.pid) == []

    # A hint made at the main thread's exit would carry its status (0) and an earlier time.
    killed_at = time.monotonic()
    procs.kill(child)
    wait_for(lambda: hints.exits(child.pid), what="the hint for the last thread's exit")
    round_trip(source, hints, children)
    [hint] = hints.exits(child.pid)
    assert hint.status == signal.SIGKILL
    assert hint.at >= killed_at
    assert hint.starttime == child.owner.starttime
    assert hints.dead_on_arrival[child.pid] == [True]


def test_reused_pid_event_carries_the_real_start_time(source, hints, children):
    child = owner_child(children)
    real = procfs.read_stat(child.pid).starttime
    stale = Owner(current_boot_id(), child.pid, real + 1)
    source.watch(stale)
    # watch() confirms in /proc and finds the stale owner dead at once.
    wait_for(lambda: hints.exits(child.pid), what="the hint from watch()'s own check")
    procs.kill(child)
    [hint] = wait_for(lambda: hints.kernel_exits(child.pid), what="the kernel's hint")
    assert hint.starttime == real != stale.starttime


def test_unwatch_of_one_owner_keeps_another_with_the_same_pid(source, hints, children):
    child = owner_child(children)
    stale = Owner(current_boot_id(), child.pid, child.owner.starttime + 1)
    source.watch(stale)
    source.watch(child.owner)
    source.unwatch(stale)
    procs.kill(child)
    wait_for(lambda: hints.kernel_exits(child.pid), what="the live owner's hint")


def test_unwatched_owner_is_not_reported(source, hints, children):
    child = owner_child(children)
    source.watch(child.owner)
    source.unwatch(child.owner)
    source.unwatch(child.owner)  # twice: nothing left to remove is fine
    procs.kill(child)
    round_trip(source, hints, children)
    assert hints.exits(child.pid) == []


def test_owner_dead_before_watch_is_reported(source, hints, children):
    zombie = procs.spawn_zombie()
    children.append(zombie)
    source.watch(zombie.owner)
    wait_for(lambda: hints.exits(zombie.pid), what="the zombie's hint")

    gone = owner_child(children)
    procs.kill(gone)
    source.watch(gone.owner)
    wait_for(lambda: hints.exits(gone.pid), what="the reaped child's hint")


class RecordingPoll(PollSource):
    def __init__(self) -> None:
        super().__init__(interval=0.05)
        self.watched: list[Owner] = []

    def watch(self, owner: Owner) -> None:
        self.watched.append(owner)
        super().watch(owner)


def test_full_map_hands_the_rest_to_the_fallback(hints, children):
    fallback = RecordingPoll()
    src = EbpfSource(max_owners=2, fallback=fallback)
    src.start(hints)
    try:
        owners = [owner_child(children) for _ in range(3)]
        for child in owners:
            src.watch(child.owner)
        assert src.overflowed == 1
        assert fallback.watched == [owners[2].owner]
        for child in owners:
            procs.kill(child)
        for child in owners:
            wait_for(lambda c=child: hints.exits(c.pid), what=f"the hint for {child.pid}")
    finally:
        src.stop()


def test_full_map_without_fallback_refuses_to_watch(hints, children):
    src = EbpfSource(max_owners=1)
    src.start(hints)
    try:
        first, second = owner_child(children), owner_child(children)
        src.watch(first.owner)
        with pytest.raises(SourceError, match="map full"):
            src.watch(second.owner)
    finally:
        src.stop()


def test_full_ring_buffer_reports_lost_hints(children):
    first_seen, go_on = threading.Event(), threading.Event()
    hints = Hints()

    def slow_emit(hint: Hint) -> None:
        hints(hint)
        first_seen.set()
        go_on.wait()

    # One page holds 170 records; the reader is held up while 256 deaths arrive.
    src = EbpfSource(ring_bytes=os.sysconf("SC_PAGE_SIZE"))
    src.start(slow_emit)
    sleepers: list[subprocess.Popen] = []
    try:
        blocker = owner_child(children)
        src.watch(blocker.owner)
        procs.kill(blocker)
        assert first_seen.wait(10)
        sleepers = [subprocess.Popen(["sleep", "600"]) for _ in range(256)]
        for proc in sleepers:
            src.watch(owner_of(proc.pid))
        for proc in sleepers:
            proc.kill()
            proc.wait()
        go_on.set()
        lost = wait_for(
            lambda: [h for h in list(hints.all) if isinstance(h, Lost)], what="a Lost hint"
        )
        assert "ring buffer full" in lost[0].reason
    finally:
        go_on.set()
        for proc in sleepers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        src.stop()


def test_stop_is_idempotent_and_watch_after_it_is_refused(hints, children):
    src = EbpfSource()
    src.start(hints)
    src.stop()
    src.stop()
    with pytest.raises(SourceError, match="not running"):
        src.watch(owner_child(children).owner)
    src.unwatch(owner_of())  # nothing watched any more: a no-op


@pytest.mark.parametrize("started", [True, False], ids=["started", "probed"])
def test_a_stopped_source_goes_at_once_with_its_callback(hints, started):
    # Its ring's ctypes callback holds it; kept past stop(), the pair waited for the garbage
    # collector, which freed the callback wherever it ran (see test_mdwe.py for where that
    # went wrong). Stopped, nothing of it is left for the collector.
    gc.disable()
    try:
        src = EbpfSource()
        if started:
            src.start(hints)
        else:
            src.load()  # as probe() does
        src.stop()
        gone = weakref.ref(src)
        del src
        assert gone() is None
    finally:
        gc.enable()


def test_probe_says_why_it_cannot_run(tmp_path):
    assert ebpf.probe() is None
    missing = tmp_path / "missing.bpf.o"
    assert "missing" in ebpf.probe(str(missing))
    garbage = tmp_path / "garbage.bpf.o"
    garbage.write_bytes(b"not an ELF file")
    assert ebpf.probe(str(garbage)).startswith(f"cannot open {garbage}")


def test_group_exiting_needs_every_thread_in_do_exit(children):
    live = owner_child(children)
    assert not procfs.group_exiting(live.pid)
    zombie = procs.spawn_zombie()
    children.append(zombie)
    assert procfs.group_exiting(zombie.pid)
    two = procs.spawn_main_thread_exits_first()
    children.append(two)
    procs.exit_main_thread(two)
    wait_for(lambda: procfs.read_stat(two.pid).state == "Z", what="the main thread to exit")
    assert not procfs.group_exiting(two.pid)
