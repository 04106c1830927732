"""The workdir kind on real directories, real mounts and a real unprivileged attacker.

Runs as root. Roots are fresh 1777 directories under /tmp, like /tmp itself; the victim is a
root-owned tree outside them whose checksum must never change.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import pwd
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from exitwatch.contract import MARKER, mark_workdir
from exitwatch.kinds import fsops, inotify
from exitwatch.kinds.base import Change, Found, Gone, Resource, Snapshot
from exitwatch.kinds.workdirs import tree as workdir_tree
from exitwatch.kinds.workdirs import watch as workdir_watch
from exitwatch.kinds.workdirs.kind import KIND, Workdirs
from exitwatch.owner import Owner, current_boot_id, owner_of

from support.procs import reused_pid_owner, wait_for
from support.trees import digest, lazy_umount_below
from support.users import SYSTEM_PYTHON, as_user, run_as, swapping_as

DEAD = reused_pid_owner()


@pytest.fixture
def root() -> Iterator[Path]:
    """A world-writable sticky root, like /tmp. Mounts below it go before it does."""
    top = tempfile.mkdtemp(prefix="exitwatch-test-")
    os.chmod(top, 0o1777)
    try:
        yield Path(top)
    finally:
        # rmtree would descend into a bind mount and wipe the victim.
        lazy_umount_below(top)
        shutil.rmtree(top)


@pytest.fixture(params=["openat2", "fallback"])
def resolve(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a removal test once with openat2 and once with the O_NOFOLLOW + mount id checks."""
    if request.param == "fallback":
        monkeypatch.setattr(fsops, "have_openat2", lambda: False)
    elif not fsops.have_openat2():
        pytest.skip("this kernel has no openat2")
    return request.param


@pytest.fixture(autouse=True)
def _no_fd_leak() -> Iterator[None]:
    before = set(os.listdir("/proc/self/fd"))
    yield
    leaked = set(os.listdir("/proc/self/fd")) - before
    assert not leaked, f"file descriptors leaked: {sorted(leaked)}"


@pytest.fixture
def owner() -> Owner:
    # Removal checks that the owner is dead; this pid with another start time is.
    return DEAD


def write_marker(path: Path, owner: Owner) -> None:
    tmp = path / f"{MARKER}.tmp"
    tmp.write_text(json.dumps({"owner": str(owner)}))
    tmp.rename(path / MARKER)


def marked(path: Path, body: bytes | None = None) -> Path:
    """Create directory `path` with a marker naming a dead owner (or holding `body`)."""
    path.mkdir(parents=True, exist_ok=True)
    if body is None:
        write_marker(path, DEAD)
    else:
        (path / MARKER).write_bytes(body)
    return path


def resource(path: Path, owner: Owner) -> Resource:
    return Resource("workdir", str(path), owner, name=str(path))


def keys(snapshot: Snapshot) -> set[str]:
    return {r.key for r in snapshot.resources}


# Discovery: scan


def test_scan_finds_markers_down_to_the_depth_limit(root: Path, owner: Owner) -> None:
    shallow = marked(root / "a")
    middle = marked(root / "b" / "c")
    deepest = marked(root / "d" / "e" / "f")
    marked(root / "g" / "h" / "i" / "j")  # one level too deep
    marked(shallow / "nested")  # below a workdir: the workdir's own business
    (root / "plain" / "dir").mkdir(parents=True)

    snap = Workdirs([str(root)], depth=3).scan()

    assert snap.kind == "workdir"
    assert keys(snap) == {str(shallow), str(middle), str(deepest)}
    assert all(r.owner == owner and r.name == r.key for r in snap.resources)
    assert keys(Workdirs([str(root)], depth=1).scan()) == {str(shallow)}


def test_scan_raises_when_a_marker_cannot_be_read_now(root: Path) -> None:
    """A periodic reconcile's listing without the workdir would read as it gone."""
    marked(root / "readable")
    leased = marked(root / "leased")
    # Another process holds a write lease on the marker: a non-blocking read fails
    # (EWOULDBLOCK) until the lease is broken, lease-break-time (45 s) later.
    holder = subprocess.Popen(
        [
            "python3",
            "-c",
            "import fcntl, os, signal, sys; signal.signal(signal.SIGIO, signal.SIG_IGN);"
            "fd = os.open(sys.argv[1], os.O_RDWR);"
            "fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK);"
            "print('leased', flush=True); sys.stdin.read()",
            str(leased / MARKER),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "leased\n"
        with pytest.raises(OSError, match="1 markers unreadable now"):
            Workdirs([str(root)]).scan()
    finally:
        assert holder.stdin is not None and holder.stdout is not None
        holder.stdin.close()
        holder.stdout.close()
        holder.wait(10)
    assert len(Workdirs([str(root)]).scan().resources) == 2


def test_each_outcome_names_its_workdir(root: Path, owner: Owner) -> None:
    """So that only the workdirs that failed are retried, not every one of the job."""
    paths = {str(marked(root / "a")), str(marked(root / "b"))}
    kind = Workdirs([str(root)])
    outcomes = kind.reap(owner, list(kind.scan().resources), dry_run=False)
    assert {o.key for o in outcomes} == paths and all(o.ok for o in outcomes)


def test_scan_never_follows_symlinks(root: Path, victim: Path) -> None:
    outside = marked(victim / "sub" / "marked")
    (root / "to-outside").symlink_to(outside)
    (root / "to-victim").symlink_to(victim / "sub")
    inside = marked(root / "real")
    (root / "x").mkdir()
    (root / "x" / "to-inside").symlink_to(inside)

    assert keys(Workdirs([str(root)]).scan()) == {str(inside)}


def test_scan_never_enters_a_mount_point(root: Path, victim: Path, resolve: str) -> None:
    marked(victim / "sub" / "marked")
    (root / "mnt").mkdir()
    subprocess.run(["mount", "--bind", str(victim), str(root / "mnt")], check=True)

    assert keys(Workdirs([str(root)]).scan()) == set()


def test_scan_warns_once_per_malformed_marker_and_skips_it(
    root: Path, owner: Owner, caplog: pytest.LogCaptureFixture
) -> None:
    good = marked(root / "good")
    bad: dict[str, Path] = {
        "is not JSON": marked(root / "not-json", b"owner: me"),
        "larger than 4096": marked(
            root / "huge", json.dumps({"owner": str(owner), "pad": "x" * 5000}).encode()
        ),
        "is not UTF-8": marked(root / "latin1", b'{"owner": "caf\xe9"}'),
        'no "owner"': marked(root / "no-owner", b'{"who": "me"}'),
        "bad owner": marked(root / "bad-owner", b'{"owner": "1:2:3"}'),
        "a FIFO": root / "fifo",
        "a symlink": root / "symlink",
        "a directory": root / "dir",
        "a character device": root / "device",
    }
    for name in ("fifo", "symlink", "dir", "device"):
        (root / name).mkdir()
    os.mkfifo(root / "fifo" / MARKER)
    (root / "symlink" / MARKER).symlink_to(good / MARKER)
    (root / "dir" / MARKER).mkdir()
    os.mknod(root / "device" / MARKER, stat.S_IFCHR | 0o600, os.makedev(1, 3))

    # A blocking open of the FIFO would hang here: scan on a thread, with a deadline.
    result: list[Snapshot] = []
    with caplog.at_level(logging.WARNING, logger="exitwatch.kinds.workdirs.tree"):
        t = threading.Thread(
            target=lambda: result.append(Workdirs([str(root)]).scan()), daemon=True
        )
        t.start()
        t.join(timeout=10)
    assert not t.is_alive(), "scan blocked on a marker"

    assert keys(result[0]) == {str(good)}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    for problem, path in bad.items():
        hits = [w for w in warnings if str(path / MARKER) in w]
        assert len(hits) == 1 and problem in hits[0] and "\n" not in hits[0], (problem, hits)
    assert len(warnings) == len(bad)


def test_scan_warns_on_an_unreadable_marker(
    root: Path, attacker: pwd.struct_passwd, caplog: pytest.LogCaptureFixture
) -> None:
    locked = marked(root / "locked")
    os.chmod(locked / MARKER, 0o000)
    kind = Workdirs([str(root)])
    # Root reads anything; scanning with the attacker's effective uid makes it unreadable.
    os.setegid(attacker.pw_gid)
    os.seteuid(attacker.pw_uid)
    try:
        snap = kind.scan()
    finally:
        os.seteuid(0)
        os.setegid(0)
    assert keys(snap) == set()
    assert any(
        str(locked / MARKER) in r.getMessage() and "unreadable" in r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING
    )


def test_a_marker_the_scanner_may_not_even_stat_is_skipped_not_fatal(
    root: Path, attacker: pwd.struct_passwd, caplog: pytest.LogCaptureFixture
) -> None:
    # Root meets EACCES where a user's FUSE mount (without allow_other) covers a marker.
    # Without FUSE for users here, the scan runs with the attacker's effective uid, which
    # may list this directory but not search it: stat of its marker fails the same way.
    locked = marked(root / "locked")
    good = marked(root / "good")
    os.chmod(locked, 0o444)
    os.setegid(attacker.pw_gid)
    os.seteuid(attacker.pw_uid)
    try:
        snap = Workdirs([str(root)]).scan()
    finally:
        os.seteuid(0)
        os.setegid(0)
    assert keys(snap) == {str(good)}
    assert any(
        str(locked / MARKER) in r.getMessage() and "Permission denied" in r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING
    )


def test_log_lines_show_control_characters_in_paths_escaped(
    root: Path, owner: Owner, caplog: pytest.LogCaptureFixture
) -> None:
    # A user names the directory; a raw newline would forge a log line of its own.
    evil = marked(root / "x\nWARNING exitwatch: reaped \x1b[2J", b"{")
    kind = Workdirs([str(root)])
    assert keys(kind.scan()) == set()
    [out] = kind.reap(owner, [resource(evil, owner)], dry_run=False)
    assert out.refused and out.what == f"workdir {str(evil)!r}"

    scanned, removed = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert repr(str(evil / MARKER)) in scanned and "not JSON" in scanned
    assert repr(str(evil)) in removed and "refused" in removed
    assert scanned.isprintable() and removed.isprintable()


def test_a_missing_root_is_a_warning(root: Path, caplog: pytest.LogCaptureFixture) -> None:
    present = marked(root / "here")
    missing = root / "no-such-root"
    snap = Workdirs([str(missing), str(root)]).scan()
    assert keys(snap) == {str(present)}
    assert any(
        str(missing) in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
    )


# Discovery: start


class Changes:
    """What a running kind reported, in order; `gate` pauses the reporting thread."""

    def __init__(self) -> None:
        self.seen: list[Change] = []
        self.gate = threading.Event()
        self.gate.set()
        self.blocked = threading.Event()

    def __call__(self, change: Change) -> None:
        if not self.gate.is_set():
            self.blocked.set()
        self.gate.wait()
        self.seen.append(change)

    def wait(self, want: Callable[[Change], bool], what: str, timeout: float = 10.0) -> Change:
        def seen() -> Change | None:
            return next((c for c in list(self.seen) if want(c)), None)

        return wait_for(seen, timeout=timeout, what=what)


@pytest.fixture
def running() -> Iterator[Callable[[Workdirs], Changes]]:
    started: list[Workdirs] = []
    threads_before = set(threading.enumerate())

    def start(kind: Workdirs) -> Changes:
        changes = Changes()
        kind.start(changes)
        started.append(kind)
        return changes

    yield start
    for kind in started:
        kind.stop()
        kind.stop()  # idempotent
    assert set(threading.enumerate()) <= threads_before, "a discovery thread outlived stop()"


def found(path: Path) -> Callable[[Change], bool]:
    return lambda c: isinstance(c, Found) and c.resource.key == str(path)


def gone(path: Path) -> Callable[[Change], bool]:
    return lambda c: isinstance(c, Gone) and c == Gone("workdir", str(path))


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The markers this thread reads (not a watcher's), by directory, from now on."""
    read, me, out = workdir_tree.marker.read_pinned, threading.get_ident(), []

    def counted(pfd: int, st: os.stat_result) -> Owner:
        if threading.get_ident() == me:
            out.append(os.path.dirname(os.readlink(f"/proc/self/fd/{pfd}")))
        return read(pfd, st)

    monkeypatch.setattr(workdir_tree.marker, "read_pinned", counted)
    return out


def test_a_scan_beside_the_watcher_reads_no_marker_it_has_read(
    root: Path,
    running: Callable[[Workdirs], Changes],
    reads: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(workdir_tree, "RACY_NS", 0)  # markers of a moment ago count as settled
    dirs = [marked(root / "a" / f"w{i}") for i in range(5)]
    kind = Workdirs([str(root)])
    running(kind)
    wait_for(lambda: kind.discovery == "inotify", what="the watching walk to end")
    assert keys(kind.scan()) == {str(d) for d in dirs} and reads == []
    # A scan with no watcher beside it reads every marker.
    assert keys(Workdirs([str(root)]).scan()) == {str(d) for d in dirs}
    assert sorted(reads) == sorted(map(str, dirs))


def test_a_scan_reads_again_what_changed_since_the_watcher_read_it(
    root: Path, reads: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(workdir_tree, "RACY_NS", 0)
    dirs = [marked(root / "a" / f"w{i}") for i in range(5)]
    known = workdir_tree.Tree(KIND, (str(root),), 3)  # what a watcher saw, then missed changes of
    known.walk_roots(None)
    reads.clear()
    other = owner_of(os.getpid())
    write_marker(dirs[0], other)  # a new inode
    (dirs[1] / MARKER).write_text(json.dumps({"owner": str(other), "pad": ""}))  # in place
    os.chown(dirs[2], 1, 1)  # the claim changes with the directory's owner

    found = workdir_tree.Tree(KIND, (str(root),), 3, known).walk_roots(None)
    assert sorted(reads) == sorted(map(str, dirs[:3]))
    assert {p: r.owner for p, r in found.items()} == {
        str(d): other if d in dirs[:2] else DEAD for d in dirs
    }


def test_a_marker_read_just_after_it_changed_is_read_again(root: Path, reads: list[str]) -> None:
    # Its stat may not change with a rewrite in place of the same size within one tick of
    # the file clock: until it is older than RACY_NS, no reading of it is reused.
    dirs = [marked(root / f"w{i}") for i in range(3)]
    tree = workdir_tree.Tree(KIND, (str(root),), 3)
    tree.walk_roots(None)
    assert len(reads) == 3
    tree.walk_roots(None)
    assert len(reads) == 6
    again = workdir_tree.Tree(KIND, (str(root),), 3, tree).walk_roots(None)
    assert sorted(again) == sorted(map(str, dirs))
    assert len(reads) == 9


def test_the_watcher_looks_again_at_a_racy_reading_so_a_scan_need_not(
    root: Path,
    running: Callable[[Workdirs], Changes],
    reads: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(workdir_tree, "RACY_NS", 300_000_000)
    monkeypatch.setattr(workdir_watch, "RECHECK", 0.1)
    early = marked(root / "early")
    kind = Workdirs([str(root)])
    changes = running(kind)
    wait_for(lambda: kind.discovery == "inotify", what="the watching walk to end")
    late = marked(root / "late")  # seen through inotify and read at once: racy
    changes.wait(found(late), "the late workdir")
    tree = kind._followed
    assert tree is not None
    wait_for(lambda: not tree.racy, what="the racy readings to be looked at again")
    assert keys(kind.scan()) == {str(early), str(late)} and reads == []


def test_a_directory_renamed_in_before_its_walk_is_judged_by_its_own_marker(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The walk looks at x from its parent (unmarked), then y, a workdir with another
    # below it, is renamed into x's place before x is opened to be walked.
    (root / "x").mkdir()
    marked(root / "y")
    marked(root / "y" / "inner")
    look = workdir_tree.Tree._marker_below

    def then_swap(tree: workdir_tree.Tree, parent: int, name: str, path: str) -> object:
        seen = look(tree, parent, name, path)
        if name == "x" and (root / "y").exists():
            os.rename(root / "x", root / "x.old")
            os.rename(root / "y", root / "x")
        return seen

    monkeypatch.setattr(workdir_tree.Tree, "_marker_below", then_swap)
    found = keys(Workdirs([str(root)]).scan())
    assert str(root / "x") in found and str(root / "x" / "inner") not in found


def test_start_reports_a_snapshot_first_then_changes(
    root: Path, running: Callable[[Workdirs], Changes]
) -> None:
    before = marked(root / "before")
    changes = running(Workdirs([str(root)]))
    first = wait_for(lambda: changes.seen[:1], what="the first report")[0]
    assert isinstance(first, Snapshot) and keys(first) == {str(before)}

    # New directories, filled before their watch can exist, and marked by rename.
    new = marked(root / "p" / "q" / "new")
    changes.wait(found(new), "the new workdir")

    shutil.rmtree(root / "p")
    changes.wait(gone(new), "the removed workdir to go")

    os.unlink(before / MARKER)
    changes.wait(gone(before), "the unmarked workdir to go")

    mark_workdir(before)
    os.rename(before, root / "renamed")
    changes.wait(found(root / "renamed"), "the renamed workdir")
    assert not any(isinstance(c, Snapshot) for c in changes.seen[1:])


def test_start_loses_nothing_changed_between_the_snapshot_and_the_watches(
    root: Path, owner: Owner
) -> None:
    # The Snapshot is reported before any watch exists; the reporting thread is held
    # right there while the tree changes under it.
    unmarked, moved = marked(root / "a" / "unmarked"), marked(root / "moved")
    rewritten = marked(root / "rewritten")
    changes = Changes()
    changes.gate.clear()
    kind = Workdirs([str(root)])
    kind.start(changes)
    try:
        assert changes.blocked.wait(30), "the snapshot was never reported"
        new = marked(root / "a" / "new")
        os.unlink(unmarked / MARKER)
        os.rename(moved, root / "a" / "moved")
        other = Owner(owner.boot_id, owner.pid, owner.starttime + 1)
        write_marker(rewritten, other)
        changes.gate.set()
        first = changes.wait(lambda c: isinstance(c, Snapshot), "the snapshot")
        assert keys(first) == {str(unmarked), str(moved), str(rewritten)}
        changes.wait(found(new), "the workdir made meanwhile")
        changes.wait(found(root / "a" / "moved"), "the workdir moved meanwhile")
        changes.wait(gone(moved), "its old path to go")
        changes.wait(gone(unmarked), "the workdir unmarked meanwhile to go")
        changes.wait(
            lambda c: found(rewritten)(c) and c.resource.owner == other,
            "the new owner of the rewritten marker",
        )
    finally:
        changes.gate.set()
        kind.stop()


def test_start_follows_a_directory_whose_marker_goes_and_comes(
    root: Path, running: Callable[[Workdirs], Changes]
) -> None:
    outer = marked(root / "outer")
    changes = running(Workdirs([str(root)]))
    changes.wait(lambda c: isinstance(c, Snapshot), "the snapshot")

    # Unmarked, the directory is searched: a workdir inside it now counts...
    os.unlink(outer / MARKER)
    inner = marked(outer / "inner")
    changes.wait(found(inner), "the inner workdir")
    # ...until the outer one is marked again and owns what lies below it.
    mark_workdir(outer)
    changes.wait(found(outer), "the outer workdir again")
    changes.wait(gone(inner), "the inner workdir to go")


def test_start_reads_a_marker_written_in_place_once_it_is_closed(
    root: Path,
    owner: Owner,
    running: Callable[[Workdirs], Changes],
    caplog: pytest.LogCaptureFixture,
) -> None:
    wd = root / "wd"
    wd.mkdir()
    changes = running(Workdirs([str(root)]))
    changes.wait(lambda c: isinstance(c, Snapshot), "the snapshot")

    body = json.dumps({"owner": str(owner)}).encode()
    fd = os.open(wd / MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, body[:5])
        # Events are handled in order: once the probe is found, so was the half-written
        # marker's IN_CREATE.
        probe = marked(root / "probe")
        changes.wait(found(probe), "the probe workdir")
        os.write(fd, body[5:])
    finally:
        os.close(fd)

    changes.wait(found(wd), "the workdir marked in place")
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize("how", ["symlink", "fifo", "directory", "hard link"])
def test_start_sees_a_marker_made_in_place_without_a_rescan(
    root: Path, running: Callable[[Workdirs], Changes], caplog: pytest.LogCaptureFixture, how: str
) -> None:
    good = marked(root / "good")
    wd = root / "wd"
    wd.mkdir()
    changes = running(Workdirs([str(root)]))
    changes.wait(lambda c: isinstance(c, Snapshot), "the snapshot")

    # Each raises IN_CREATE alone: no rename, no close after writing.
    if how == "symlink":
        os.symlink(good / MARKER, wd / MARKER)
    elif how == "fifo":
        os.mkfifo(wd / MARKER)
    elif how == "directory":
        os.mkdir(wd / MARKER)
    else:
        # Found, though removal will refuse it for its two links.
        os.link(good / MARKER, wd / MARKER)
        changes.wait(found(wd), "the hard-linked marker's workdir")
        return
    what = {"symlink": "a symlink", "fifo": "a FIFO", "directory": "a directory"}[how]
    hits = wait_for(
        lambda: [
            r.getMessage()
            for r in caplog.records
            if r.levelno == logging.WARNING and str(wd / MARKER) in r.getMessage()
        ],
        what=f"a warning about the marker made as {what}",
    )
    assert what in hits[0]


_LEASER = r"""
import fcntl, os, signal, sys
signal.signal(signal.SIGIO, signal.SIG_IGN)  # told of each open that breaks the lease
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)
print("leased", flush=True)
sys.stdin.read()
fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
"""


def test_start_reads_again_a_marker_its_owner_held_a_lease_on(
    root: Path,
    attacker: pwd.struct_passwd,
    running: Callable[[Workdirs], Changes],
    caplog: pytest.LogCaptureFixture,
) -> None:
    wd = root / "wd"
    body = json.dumps({"owner": str(DEAD)})
    run_as(attacker, 'mkdir "$1" && printf %s "$2" > "$1/.exitwatch-owner"', str(wd), body)
    # A write lease makes every other open fail with EWOULDBLOCK until it is given up.
    leaser = as_user(
        attacker,
        f'exec {SYSTEM_PYTHON} -I -S -c "$1" "$2"',
        _LEASER,
        str(wd / MARKER),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert leaser.stdout is not None and leaser.stdout.readline() == b"leased\n"
        changes = running(Workdirs([str(root)]))
        snap = changes.wait(lambda c: isinstance(c, Snapshot), "the snapshot")
        assert keys(snap) == set()
        assert any("unreadable" in r.getMessage() for r in caplog.records)
    finally:
        assert leaser.stdin is not None
        leaser.stdin.close()
        leaser.wait(timeout=30)
        leaser.stdout.close()
    # Nothing about the marker changed: only a look again finds it.
    changes.wait(found(wd), "the workdir, once the lease is given up")


def test_start_rescans_after_the_inotify_queue_overflows(
    root: Path, running: Callable[[Workdirs], Changes], caplog: pytest.LogCaptureFixture
) -> None:
    changes = running(Workdirs([str(root)]))
    changes.wait(lambda c: isinstance(c, Snapshot), "the snapshot")
    changes.gate.clear()  # the thread blocks in its next report and stops reading events
    first = marked(root / "first")
    assert changes.blocked.wait(10), "the reporting thread did not block"
    queue = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    for i in range(queue // 2 + 100):  # IN_CREATE, IN_CLOSE_WRITE and IN_DELETE each
        noise = root / f"noise-{i}"
        noise.touch()
        noise.unlink()
    later = marked(root / "later")
    changes.gate.set()

    snap = changes.wait(
        lambda c: isinstance(c, Snapshot) and str(later) in keys(c), "a fresh snapshot"
    )
    assert keys(snap) == {str(first), str(later)}
    assert any("overflow" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    "call, errno_, why",
    [
        ("watch", errno.ENOSPC, "inotify watch limit reached"),
        ("__init__", errno.EMFILE, "Too many open files"),
    ],
)
def test_start_falls_back_to_rescanning_when_inotify_fails(
    root: Path,
    running: Callable[[Workdirs], Changes],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    call: str,
    errno_: int,
    why: str,
) -> None:
    def refuse(*args: object) -> None:
        raise OSError(errno_, why)

    # The kernel's answer, injected: this host has watches and instances to spare.
    monkeypatch.setattr(inotify.Inotify, call, refuse)
    before = marked(root / "before")
    kind = Workdirs([str(root)])
    changes = running(kind)
    snap = changes.wait(lambda c: isinstance(c, Snapshot), "the snapshot")
    assert keys(snap) == {str(before)}
    # With watches refused, inotify's first walk has sent a Snapshot already, and the first
    # rescan sends its own: a workdir made before that rescan would be in it, not Found.
    # (With no inotify at all, the rescan's is the only one.)
    wait_for(lambda: kind.discovery.startswith("rescans every"), what="the first rescan")
    assert all(keys(c) == {str(before)} for c in changes.seen if isinstance(c, Snapshot))

    # A rescan's pause grows with its wall time (workdir_watch.RESCAN_SHARE), which a busy machine
    # stretches: up to POLL_MAX, the most a new workdir may wait.
    new = marked(root / "a" / "new")
    changes.wait(found(new), "the new workdir, by rescanning", workdir_watch.POLL_MAX + 10)
    shutil.rmtree(root / "a")
    changes.wait(gone(new), "the removed workdir to go, by rescanning", workdir_watch.POLL_MAX + 10)
    fallbacks = [r.getMessage() for r in caplog.records if "falls back" in r.getMessage()]
    assert len(fallbacks) == 1 and why in fallbacks[0]


# Removal


def test_remove_removes_a_workdir_and_everything_in_it(
    root: Path, owner: Owner, resolve: str
) -> None:
    wd = marked(root / "a" / "wd")
    (wd / "x" / "y").mkdir(parents=True)
    (wd / "x" / "y" / "f").write_text("data")
    (wd / "dangling").symlink_to("/nonexistent")
    os.mkfifo(wd / "fifo")

    [out] = Workdirs([str(root)]).reap(owner, [resource(wd, owner)], dry_run=False)

    assert (out.ok, out.detail, out.kind, out.what) == (True, "removed", "workdir", f"workdir {wd}")
    assert not wd.exists() and (root / "a").is_dir()
    [again] = Workdirs([str(root)]).reap(owner, [resource(wd, owner)], dry_run=False)
    assert (again.ok, again.detail) == (True, "already gone")


def test_remove_empties_a_tree_deeper_than_the_recursion_limit(root: Path, owner: Owner) -> None:
    wd = marked(root / "deep")
    fd = os.open(wd, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(2500):  # a path this long exceeds PATH_MAX: build it through fds
        os.mkdir("d", dir_fd=fd)
        nxt = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = nxt
    os.close(os.open("leaf", os.O_WRONLY | os.O_CREAT, dir_fd=fd))
    os.close(fd)

    [out] = Workdirs([str(root)]).reap(owner, [resource(wd, owner)], dry_run=False)
    assert (out.ok, out.detail) == (True, "removed")
    assert not wd.exists()


def test_remove_leaves_symlink_and_hard_link_targets_alone(
    root: Path, victim: Path, owner: Owner, resolve: str
) -> None:
    before = digest(victim)
    wd = marked(root / "wd")
    (wd / "dir-link").symlink_to(victim)
    (wd / "file-link").symlink_to(victim / "precious")
    (wd / "nested").mkdir()
    (wd / "nested" / "deeper-link").symlink_to(victim / "sub")
    os.link(victim / "precious", wd / "hard-link")

    [out] = Workdirs([str(root)]).reap(owner, [resource(wd, owner)], dry_run=False)

    assert out.ok and not wd.exists()
    assert digest(victim) == before
    assert os.stat(victim / "precious").st_nlink == 1


def test_remove_never_enters_a_bind_mount_and_says_so(
    root: Path, victim: Path, owner: Owner, resolve: str, caplog: pytest.LogCaptureFixture
) -> None:
    before = digest(victim)
    wd = marked(root / "wd")
    (wd / "mnt").mkdir()
    (wd / "other").write_text("goes")
    # Same filesystem: st_dev cannot tell, only openat2 or the mount id can.
    subprocess.run(["mount", "--bind", str(victim), str(wd / "mnt")], check=True)

    [out] = Workdirs([str(root)]).reap(owner, [resource(wd, owner)], dry_run=False)

    assert not out.ok and out.refused
    assert "mnt" in out.detail and "mount point" in out.detail
    assert digest(victim) == before
    assert (wd / MARKER).exists(), "the marker stays, so the workdir is found again"
    assert not (wd / "other").exists()
    assert any(
        str(wd) in r.getMessage() and "mnt" in r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING
    )


def test_remove_refuses_a_workdir_that_is_itself_a_mount_point(
    root: Path, victim: Path, owner: Owner, resolve: str
) -> None:
    marked(victim / "sub" / "deeper")
    before = digest(victim)
    (root / "wd").mkdir()
    subprocess.run(["mount", "--bind", str(victim / "sub"), str(root / "wd")], check=True)

    [out] = Workdirs([str(root)]).reap(
        owner, [resource(root / "wd" / "deeper", owner)], dry_run=False
    )
    assert out.refused and "mount point" in out.detail
    assert digest(victim) == before


def test_remove_refuses_when_the_workdir_or_a_parent_became_a_symlink(
    root: Path, victim: Path, owner: Owner, attacker: pwd.struct_passwd, resolve: str
) -> None:
    body = json.dumps({"owner": str(owner)})
    # The victim holds a workdir marked with the same owner: the attacker points at it.
    marked(victim / "sub" / "wd")
    before = digest(victim)
    run_as(
        attacker,
        'mkdir "$1/wd" "$1/p" && printf %s "$2" > "$1/wd/.exitwatch-owner"'
        ' && mkdir "$1/p/wd" && printf %s "$2" > "$1/p/wd/.exitwatch-owner"',
        str(root),
        body,
    )
    kind = Workdirs([str(root)])
    found_now = {r.key for r in kind.scan().resources}
    assert found_now == {str(root / "wd"), str(root / "p" / "wd")}
    run_as(
        attacker,
        'mv "$1/wd" "$1/wd.old" && ln -s "$2/sub/wd" "$1/wd"'
        ' && mv "$1/p" "$1/p.old" && ln -s "$2/sub" "$1/p"',
        str(root),
        str(victim),
    )

    outs = kind.reap(
        owner, [resource(root / "wd", owner), resource(root / "p" / "wd", owner)], dry_run=False
    )

    assert all(o.refused and "symlink" in o.detail for o in outs), outs
    assert digest(victim) == before


def test_remove_refuses_a_marker_not_owned_by_the_directory_owner(
    root: Path, owner: Owner, attacker: pwd.struct_passwd
) -> None:
    # Someone else's world-writable directory: the attacker may write into it, not claim it.
    other = root / "shared"
    other.mkdir(mode=0o777)
    os.chmod(other, 0o777)
    os.chown(other, 4242, 4242)
    (other / "keep").write_text("mine")
    run_as(
        attacker,
        'printf %s "$2" > "$1/.exitwatch-owner"',
        str(other),
        json.dumps({"owner": str(owner)}),
    )

    [out] = Workdirs([str(root)]).reap(owner, [resource(other, owner)], dry_run=False)

    assert out.refused and "uid" in out.detail
    assert (other / "keep").read_text() == "mine"


def test_remove_refuses_a_hard_linked_marker(root: Path, owner: Owner) -> None:
    # Where protected_hardlinks is off, a user could link root's marker into another directory.
    dead = marked(root / "dead")
    (root / "other").mkdir()
    os.link(dead / MARKER, root / "other" / MARKER)
    outs = Workdirs([str(root)]).reap(
        owner, [resource(dead, owner), resource(root / "other", owner)], dry_run=False
    )
    assert all(o.refused and "hard links" in o.detail for o in outs), outs


def test_remove_accepts_a_root_owned_marker_in_a_user_directory(
    root: Path, owner: Owner, attacker: pwd.struct_passwd
) -> None:
    run_as(attacker, 'mkdir "$1/users" && touch "$1/users/file"', str(root))
    write_marker(root / "users", owner)  # root marks it, as an agent-side runner would
    [out] = Workdirs([str(root)]).reap(owner, [resource(root / "users", owner)], dry_run=False)
    assert out.ok and not (root / "users").exists()


def test_remove_refuses_a_root_and_paths_outside_the_roots(
    root: Path, owner: Owner, tmp_path: Path
) -> None:
    marked(root)
    elsewhere = marked(tmp_path / "elsewhere")
    kind = Workdirs([str(root)], depth=2)
    tries = [root, elsewhere, root / ".." / root.name / "x", root / "a" / "b" / "c"]

    outs = kind.reap(owner, [resource(p, owner) for p in tries], dry_run=False)

    assert [o.refused for o in outs] == [True] * 4, outs
    assert "root" in outs[0].detail
    assert (root / MARKER).exists() and (elsewhere / MARKER).exists()


def test_remove_refuses_a_marker_naming_another_owner(root: Path, owner: Owner) -> None:
    wd = marked(root / "wd")
    someone = Owner(current_boot_id(), 1, 1)
    [out] = Workdirs([str(root)]).reap(someone, [resource(wd, someone)], dry_run=False)
    assert out.refused and str(owner) in out.detail
    assert (wd / MARKER).exists()


def test_remove_refuses_a_missing_or_malformed_marker(root: Path, owner: Owner) -> None:
    bare = root / "bare"
    bare.mkdir()
    bad = marked(root / "bad", b"{")
    outs = Workdirs([str(root)]).reap(
        owner, [resource(bare, owner), resource(bad, owner)], dry_run=False
    )
    assert [o.refused for o in outs] == [True, True]
    assert "no marker" in outs[0].detail and "not JSON" in outs[1].detail
    assert bare.exists() and bad.exists()


def test_remove_keeps_a_nested_workdir_of_another_owner_while_it_lives(
    root: Path, owner: Owner
) -> None:
    wd = marked(root / "wd")
    (wd / "mine").write_text("goes")
    alive = owner_of()
    nested = marked(wd / "theirs", json.dumps({"owner": str(alive)}).encode())
    (nested / "data").write_text("stays")
    dead = marked(wd / "dead", json.dumps({"owner": str(Owner(current_boot_id(), 1, 1))}).encode())

    [out] = Workdirs([str(root)]).reap(owner, [resource(wd, owner)], dry_run=False)

    assert out.refused and "theirs" in out.detail and "who is alive" in out.detail
    assert (nested / "data").read_text() == "stays"
    assert not (wd / "mine").exists()
    # A nested workdir of a dead owner is not spared: it would leak for good.
    assert not dead.exists()


def test_dry_run_touches_nothing(root: Path, owner: Owner) -> None:
    wd = marked(root / "wd")
    (wd / "f").write_text("x")
    before = digest(root)
    [out] = Workdirs([str(root)]).reap(owner, [resource(wd, owner)], dry_run=True)
    assert (out.ok, out.detail) == (True, "would remove")
    assert digest(root) == before


_SWAPPER = r"""
import os, sys
wd, victim = sys.argv[1], sys.argv[2]

def swap(path):
    # `path` becomes a symlink to the victim for a moment, then itself again.
    for step in (lambda: os.rename(path, path + ".real"), lambda: os.symlink(victim, path),
                 lambda: os.unlink(path), lambda: os.rename(path + ".real", path)):
        try:
            step()
        except OSError:
            pass

targets = [os.path.join(wd, f"sub{i}") for i in range(10)]
print("swapping", flush=True)
while True:
    for path in targets:
        swap(path)
"""


def test_remove_survives_an_attacker_swapping_symlinks_in_a_loop(
    root: Path, victim: Path, owner: Owner, attacker: pwd.struct_passwd, resolve: str
) -> None:
    before = digest(victim)
    body = json.dumps({"owner": str(owner)})
    kind = Workdirs([str(root)])
    for i in range(40):
        wd = root / f"wd{i}"
        run_as(
            attacker,
            'for i in $(seq 0 9); do mkdir -p "$1/sub$i/a/b" && '
            'touch "$1/sub$i/a/b/f" "$1/sub$i/g" || exit 1; done && '
            'printf %s "$2" > "$1/.exitwatch-owner"',
            str(wd),
            body,
        )
        swapper = swapping_as(attacker, _SWAPPER, wd, victim)
        try:
            # Only once the swaps are under way does the removal race them.
            assert swapper.stdout is not None and swapper.stdout.readline() == b"swapping\n"
            [out] = kind.reap(owner, [resource(wd, owner)], dry_run=False)
        finally:
            swapper.send_signal(signal.SIGKILL)
            swapper.wait()
            swapper.stdout.close()
        assert digest(victim) == before, f"iteration {i}: the victim changed ({out})"
        if wd.exists():  # refused or partly removed: the attacker won that round
            shutil.rmtree(wd)


def test_remove_never_raises_for_one_failure(root: Path, owner: Owner) -> None:
    wd = marked(root / "wd")
    (wd / "stuck").write_text("x")
    subprocess.run(["chattr", "+i", str(wd / "stuck")], check=True)
    try:
        good = marked(root / "good")
        outs = Workdirs([str(root)]).reap(
            owner, [resource(wd, owner), resource(good, owner)], dry_run=False
        )
    finally:
        subprocess.run(["chattr", "-i", str(wd / "stuck")], check=True)
    assert not outs[0].ok and not outs[0].refused and "stuck" in outs[0].detail
    assert outs[1].ok and not good.exists()


def test_remove_refuses_while_the_owner_lives(root: Path) -> None:
    alive = owner_of()
    wd = root / "live"
    wd.mkdir()
    write_marker(wd, alive)
    [out] = Workdirs([str(root)]).reap(alive, [resource(wd, alive)], dry_run=False)
    assert out.refused and not out.ok and "alive" in out.detail
    assert (wd / MARKER).exists()


def test_a_deeply_nested_marker_is_one_warning(root: Path, caplog: pytest.LogCaptureFixture):
    wd = marked(root / "deep", b"[" * 4000)
    assert keys(Workdirs([str(root)]).scan()) == set()
    assert any(
        str(wd / MARKER) in r.getMessage() and "nested too deeply" in r.getMessage()
        for r in caplog.records
    )


def test_a_stop_ends_the_watching_walk_within_a_thousand_directories(root: Path) -> None:
    # The watching walk follows the Snapshot, when an agent started and stopped at once
    # is told to stop: it must not hold the discovery thread for the whole tree.
    for i in range(workdir_watch.STOP_EVERY + 10):
        (root / f"d{i}").mkdir()
    changes = Changes()
    stop_r, stop_w = os.pipe()
    tree = workdir_tree.Tree(KIND, (str(root),), 3)
    watcher = workdir_watch._Watcher(tree, "workdir", changes, stop_r)
    try:
        os.write(stop_w, b"x")
        with pytest.raises(workdir_watch._Stopped):
            watcher.sync()
        assert [type(c) for c in changes.seen] == [Snapshot]
        assert len(watcher.ino.dirs) == workdir_watch.STOP_EVERY - 1
    finally:
        watcher.ino.close()
        os.close(stop_r)
        os.close(stop_w)
