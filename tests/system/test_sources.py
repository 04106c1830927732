import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import TypeVar

import pytest

from exitwatch.owner import Owner, death, owner_of
from exitwatch.sources import MODES, ebpf, pick, self_test
from exitwatch.sources import netlink as nl
from exitwatch.sources.base import Exit, Hint, Lost, SourceError
from exitwatch.sources.netlink import NetlinkSource
from exitwatch.sources.poll import PollSource

from support import procs
from support.procs import wait_for

T = TypeVar("T")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# As in test_ebpf.py: a missing object is a broken build, not a host without eBPF.
EBPF_PROBLEM = ebpf.probe() if os.path.exists(ebpf.OBJ_PATH) else None


class Hints:
    """An emit that records every hint; called from the source's thread."""

    def __init__(self) -> None:
        self.all: list[Hint] = []

    def __call__(self, hint: Hint) -> None:
        self.all.append(hint)

    def exits(self, pid: int) -> list[Exit]:
        return [h for h in list(self.all) if isinstance(h, Exit) and h.pid == pid]

    def lost(self) -> list[Lost]:
        return [h for h in list(self.all) if isinstance(h, Lost)]


pytestmark = pytest.mark.usefixtures("no_leaked_threads")


@pytest.fixture
def hints():
    return Hints()


@pytest.fixture
def netlink_source(hints):
    source = NetlinkSource()
    source.start(hints)
    yield source
    source.stop()


@pytest.fixture
def poll_source(hints):
    source = PollSource(interval=0.05)
    source.start(hints)
    yield source
    source.stop()


def exit_of(source, hints, child, how):
    """Watch `child`, end it with `how`, and return the hint the source gives for it."""
    source.watch(child.owner)
    how(child)
    return wait_for(lambda: hints.exits(child.pid), what=f"an exit hint for pid {child.pid}")


# --- netlink: real kernel --------------------------------------------------------------


def test_netlink_sigkill_gives_raw_status_9(netlink_source, hints):
    child = procs.spawn_owner()
    hint = exit_of(netlink_source, hints, child, lambda c: procs.kill(c, signal.SIGKILL))
    assert [h.status for h in hint] == [9]


def test_netlink_exit_code_3_gives_raw_status_0x300(netlink_source, hints):
    child = procs.spawn_owner(exit_code=3)
    hint = exit_of(netlink_source, hints, child, procs.reap)
    assert [h.status for h in hint] == [0x300]


def test_netlink_without_the_kernel_filter_drops_other_events(hints):
    # What a kernel older than 6.6 does: every proc event comes, fork and exec included.
    source = NetlinkSource(exit_only=False)
    source.start(hints)
    try:
        child = procs.spawn_owner(exit_code=4)
        assert [h.status for h in exit_of(source, hints, child, procs.reap)] == [0x400]
    finally:
        source.stop()


def test_netlink_emits_only_watched_pids(netlink_source, hints):
    unwatched = procs.spawn_owner()
    dropped = procs.spawn_owner()
    shared = procs.spawn_owner()
    netlink_source.watch(dropped.owner)
    netlink_source.unwatch(dropped.owner)
    # Two owners share a pid: dropping one keeps the pid watched.
    netlink_source.watch(shared.owner)
    netlink_source.watch(Owner(shared.owner.boot_id, shared.pid, shared.owner.starttime + 1))
    netlink_source.unwatch(shared.owner)
    procs.kill(unwatched)
    procs.kill(dropped)
    procs.kill(shared)
    wait_for(lambda: hints.exits(shared.pid), what="the hint of the pid still watched")
    # Started after the others were reaped, so its exit is reported after theirs.
    sentinel = procs.spawn_owner()
    exit_of(netlink_source, hints, sentinel, procs.kill)
    assert not hints.exits(unwatched.pid)
    assert not hints.exits(dropped.pid)


def test_netlink_main_thread_exits_first(netlink_source, hints):
    child = procs.spawn_main_thread_exits_first()
    try:
        netlink_source.watch(child.owner)
        procs.exit_main_thread(child)
        wait_for(lambda: hints.exits(child.pid), what="the hint of the main thread's exit")
        # The leader is a zombie but its other thread runs: the owner lives.
        assert procs.state(child.pid) == "Z"
        assert death(child.owner) is None
        seen = len(hints.exits(child.pid))
        procs.release(child)
        wait_for(lambda: len(hints.exits(child.pid)) > seen, what="the last thread's hint")
        # The kernel reports an exit after releasing the task, so /proc agrees by now.
        assert death(child.owner) is not None
    finally:
        procs.reap(child)


def _despite_overflow(source: NetlinkSource, one: Callable[[], T]) -> T:
    """What one() returns: it makes an owner, ends it and waits for what its exit gives.
    The buffer is the kernel's smallest and the connector sends every exit on the host, so
    beside other tests it may overflow and lose that exit: then one() runs again, but only
    if the source counted that loss. An exit gone with no loss counted is a failure."""
    for _ in range(10):
        lost = source.lost
        try:
            return one()
        except AssertionError as err:
            assert source.lost > lost, f"{err}, and no loss was counted"
    raise AssertionError("10 exits in a row lost to overflows")


def test_netlink_enobufs_counts_emits_lost_and_keeps_delivering(hints):
    first = None
    stalled = threading.Event()
    resume = threading.Event()

    def slow_consumer(hint):
        hints(hint)
        # Hold the reader inside emit while the storm fills its tiny buffer.
        if isinstance(hint, Exit) and first and hint.pid == first.pid and not stalled.is_set():
            stalled.set()
            resume.wait()

    def stall() -> None:
        nonlocal first
        first = procs.spawn_owner()
        source.watch(first.owner)
        procs.kill(first)
        wait_for(stalled.is_set, what=f"the reader to stall in emit on pid {first.pid}")

    def later() -> list[int]:
        owner = procs.spawn_owner(exit_code=5)
        return [h.status for h in exit_of(source, hints, owner, procs.reap)]

    source = NetlinkSource(rcvbuf=1)  # the kernel raises it to its minimum
    source.start(slow_consumer)
    try:
        _despite_overflow(source, stall)
        lost = source.lost
        procs.fork_storm(200)
        resume.set()
        wait_for(lambda: source.lost > lost, what="an ENOBUFS count")
        assert hints.lost()[0].reason == "netlink receive buffer overflowed (ENOBUFS)"
        assert _despite_overflow(source, later) == [0x500]
    finally:
        resume.set()
        source.stop()


def test_netlink_reopens_after_a_reader_failure(hints, caplog):
    failed = threading.Event()

    def buggy_consumer(hint):
        hints(hint)
        if isinstance(hint, Exit) and not failed.is_set():
            failed.set()
            raise RuntimeError("consumer bug")

    source = NetlinkSource()
    source.start(buggy_consumer)
    try:
        exit_of(source, hints, procs.spawn_owner(), procs.kill)
        # Lost comes once the new subscription is live, so exits after it are seen.
        wait_for(hints.lost, what="a Lost hint after the reopen")
        assert hints.lost()[0].reason == "netlink reader failed"
        exit_of(source, hints, procs.spawn_owner(), procs.kill)
    finally:
        source.stop()
    assert "consumer bug" in caplog.text


def test_netlink_stop_is_idempotent_and_works_before_start():
    never_started = NetlinkSource()
    never_started.stop()
    started = NetlinkSource()
    started.start(lambda hint: None)
    started.stop()
    started.stop()


def test_netlink_receive_buffer_size_is_forced():
    rcvbuf = socket.SOL_SOCKET, socket.SO_RCVBUF
    with nl.open_socket(nl.DEFAULT_RCVBUF, exit_only=True) as big:
        assert big.getsockopt(*rcvbuf) >= nl.DEFAULT_RCVBUF  # above net.core.rmem_max
    with nl.open_socket(1, exit_only=True) as tiny:
        assert tiny.getsockopt(*rcvbuf) < 64 * 1024


def test_netlink_has_no_problem_here():
    assert nl.problem() is None


# --- poll ------------------------------------------------------------------------------


def test_poll_detects_sigkilled_owner(poll_source, hints):
    child = procs.spawn_owner()
    assert [h.status for h in exit_of(poll_source, hints, child, procs.kill)] == [None]


def test_poll_reports_zombie_with_its_status(poll_source, hints):
    killed = procs.spawn_owner()
    try:
        hint = exit_of(poll_source, hints, killed, lambda c: procs.kill(c, reap_it=False))
        assert [h.status for h in hint] == [9]
    finally:
        procs.reap(killed)
    zombie = procs.spawn_zombie(exit_code=3)
    try:
        assert [h.status for h in exit_of(poll_source, hints, zombie, lambda c: None)] == [0x300]
    finally:
        procs.reap(zombie)


def test_poll_detects_reused_pid_and_spares_the_living(poll_source, hints):
    live = procs.spawn_owner()
    try:
        poll_source.watch(live.owner)
        reused = procs.reused_pid_owner()
        poll_source.watch(reused)
        wait_for(lambda: hints.exits(reused.pid), what="the reused pid's hint")
        # Once per owner: a later death is reported, the reused pid's is not repeated.
        exit_of(poll_source, hints, procs.spawn_owner(), procs.kill)
        assert len(hints.exits(reused.pid)) == 1
        assert not hints.exits(live.pid)
        poll_source.unwatch(reused)
        poll_source.watch(reused)
        wait_for(lambda: len(hints.exits(reused.pid)) == 2, what="a hint after re-watching")
    finally:
        procs.kill(live)


# --- pick ------------------------------------------------------------------------------


def test_pick_netlink_gives_a_fresh_working_source():
    source, reason = pick("netlink", poll_interval=1.0)
    assert isinstance(source, NetlinkSource)
    assert reason.startswith("netlink: self-test passed (")
    hints = Hints()
    source.start(hints)  # the returned source is fresh: it starts with the caller's emit
    try:
        exit_of(source, hints, procs.spawn_owner(), procs.kill)
    finally:
        source.stop()


def test_pick_explicit_modes():
    assert MODES == ("auto", "ebpf", "netlink", "poll")
    source, reason = pick("poll", poll_interval=0.5)
    assert isinstance(source, PollSource) and source.interval == 0.5
    assert reason == "poll: chosen explicitly"
    source, reason = pick("netlink", poll_interval=1.0)
    assert isinstance(source, NetlinkSource)
    assert reason.startswith("netlink: self-test passed (")
    with pytest.raises(SourceError, match="unknown source 'ebpf2'"):
        pick("ebpf2", poll_interval=1.0)


def test_self_test_failure_is_a_source_error():
    class Deaf(PollSource):
        def watch(self, owner):
            pass

    with pytest.raises(SourceError, match="self-test timed out"):
        self_test(Deaf, timeout=0.2)


class _Lossy(PollSource):
    """Says hints were lost and reports no exit, on each of its first `losses` instances."""

    made = 0

    def __init__(self, losses: int) -> None:
        super().__init__(interval=0.05)
        type(self).made += 1
        self.lossy = type(self).made <= losses

    def start(self, emit):
        if not self.lossy:
            return super().start(emit)
        emit(Lost("a test's overflow"))
        return super().start(lambda hint: None)  # the exit is lost


@pytest.mark.parametrize("losses", [1, 2])
def test_a_self_test_whose_exit_was_lost_is_made_again(losses):
    class Lossy(_Lossy):
        made = 0

    self_test(lambda: Lossy(losses), timeout=2)
    assert Lossy.made == losses + 1


def test_a_self_test_that_loses_every_exit_is_a_source_error():
    class Lossy(_Lossy):
        made = 0

    lost = r"exit hint of 3 self-tests was lost \(a test's overflow\)"
    with pytest.raises(SourceError, match=lost):
        self_test(lambda: Lossy(99), timeout=0.2)
    assert Lossy.made == 3


def test_the_self_test_child_runs_no_python():
    # A fork running Python shares the agent's ctypes callbacks when there is no W+X memory
    # (test_mdwe.py); the self-test's child is a program of its own.
    code = (
        "import os\n"
        "os.register_at_fork(after_in_child=lambda: os.write(2, b'python in a forked child'))\n"
        "from exitwatch.sources import pick\n"
        "print(pick('netlink', poll_interval=1.0)[1])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, check=True, capture_output=True, text=True
    )
    assert done.stdout.startswith("netlink: self-test passed (")
    assert "python in a forked child" not in done.stderr


def in_child_as_nobody(fn):
    """Run `fn` in a forked child with root's privileges dropped; return what it printed."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            os.write(w, fn().encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        out = f.read()
    os.waitpid(pid, 0)
    return out


def test_pick_falls_back_to_poll_when_not_root():
    out = in_child_as_nobody(lambda: repr(pick("auto", poll_interval=1.0)))
    assert "PollSource" in out
    assert (
        "poll: ebpf unavailable: not root (euid 65534); netlink unavailable: not root (euid 65534)"
        in out
    )


def test_pick_netlink_explicitly_when_not_root_says_why():
    def explicit():
        try:
            pick("netlink", poll_interval=1.0)
        except SourceError as err:
            return str(err)
        return "no error"

    assert in_child_as_nobody(explicit) == "netlink unavailable: not root (euid 65534)"


def test_pick_falls_back_without_cap_net_admin():
    code = "from exitwatch.sources import pick; print(pick('auto', poll_interval=1.0)[1])"
    # Without CAP_BPF, CAP_PERFMON and CAP_SYS_ADMIN the ebpf source cannot load either.
    drop = "--bounding-set=-net_admin,-bpf,-perfmon,-sys_admin"
    out = subprocess.run(
        ["setpriv", drop, "--", sys.executable, "-c", code],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert out.startswith("poll: ebpf unavailable: ")
    assert out.strip().endswith(
        "; netlink unavailable: no CAP_NET_ADMIN in the effective capability set"
    )


@pytest.mark.skipif(EBPF_PROBLEM is not None, reason=f"eBPF unusable here: {EBPF_PROBLEM}")
def test_pick_auto_prefers_ebpf_here():
    source, reason = pick("auto", poll_interval=1.0)
    assert source.name == "ebpf"
    assert reason.startswith("ebpf: self-test passed (")


def test_reused_pid_owner_names_a_live_pid_with_another_start_time():
    owner = procs.reused_pid_owner()
    assert owner.pid == os.getpid()
    assert owner.starttime != owner_of().starttime
    assert death(owner) == "pid reused (start time differs)"
