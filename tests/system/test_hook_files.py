"""The hook kind on its own, on a real spool with real processes: hooks that must never
run (special files, links, loose modes, files of another uid, hypothesis-fuzzed JSON), a
hook that hangs, and where a hook runs. test_hook_attacks.py has the attacks of issue 18
against a real agent."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import errno
import fcntl
import itertools
import json
import logging
import os
import pwd
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exitwatch import contract, on_death
from exitwatch.contract import ENV_HOOK_DIR, HOOK_FILE, HOOK_MAX_BYTES, HOOK_MAX_TIMEOUT
from exitwatch.kinds import inotify
from exitwatch.kinds.base import Found, Gone
from exitwatch.kinds.hooks.kind import FORMAT, KIND, Hooks
from exitwatch.kinds.spool import entry as hookfile
from exitwatch.kinds.spool import listing as hookspool
from exitwatch.kinds.spool.entry import Entry, ensure_spool
from exitwatch.kinds.spool.listing import MAX_PER_UID
from exitwatch.owner import Owner

from support.hooks import body, hook_id, plant
from support.procs import kill, spawn_owner, state, wait_for
from support.users import users_database

EXAMPLES = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.fixture
def every_warning(monkeypatch):
    """Every refusal warned about, as if no user had written too many (spool.WARN_LINES)."""
    monkeypatch.setattr(hookspool, "WARN_LINES", 10_000)


def side_by_side(kind: Hooks, owner: Owner, hooks: list) -> list:
    """Each hook reaped on a thread of its own, as the agent hands them over (one per job),
    and the outcomes in the order of `hooks`."""
    with ThreadPoolExecutor(len(hooks)) as pool:
        return list(pool.map(lambda h: kind.reap(owner, [h], dry_run=False)[0], hooks))


def test_the_spool_is_made_roots_and_sticky_and_a_loose_one_is_refused(tmp_path):
    path = tmp_path / "spool" / "hooks"
    umask = os.umask(0o077)  # the unit's
    try:
        ensure_spool(str(path))
    finally:
        os.umask(umask)
    assert (path.stat().st_uid, oct(path.stat().st_mode & 0o7777)) == (0, "0o1733")
    assert oct(path.parent.stat().st_mode & 0o7777) == "0o755"
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o777)
    os.chmod(loose, 0o777)
    with pytest.raises(ValueError, match="not sticky"):
        ensure_spool(str(loose))
    (tmp_path / "link").symlink_to(path)
    with pytest.raises(ValueError, match="it is a symlink, not a directory owned by root"):
        ensure_spool(str(tmp_path / "link"))


def test_registering_and_reaping_refuse_a_spool_others_could_tamper_with(
    tmp_path, dead_owner, monkeypatch, caplog
):
    canary = tmp_path / "ran"
    loose = tmp_path / "loose"
    loose.mkdir()
    os.chmod(loose, 0o777)  # not sticky: anyone could remove or replace a hook
    monkeypatch.setenv(ENV_HOOK_DIR, str(loose))
    with pytest.raises(PermissionError, match="not sticky"):
        on_death(["true"])
    assert os.listdir(loose) == []
    done = subprocess.run(
        [sys.executable, "-m", "exitwatch", "on-death", "--", "true"],
        capture_output=True,
        text=True,
    )
    [line] = done.stderr.splitlines()
    assert done.returncode == 1 and "not sticky" in line
    # A hook found there (as `exitwatch reap` would list it) is not run.
    plant(loose, 1, body(dead_owner, ["touch", str(canary)]))
    # An empty listing would read as every hook gone: it raises, and nothing runs.
    with pytest.raises(hookfile.EntryError, match="not sticky"):
        Hooks(str(loose)).scan()
    assert not canary.exists()


def test_a_failed_registration_leaves_no_temporary_file(spool):
    """A write that fails (here: a spool on a full tmpfs) takes its temporary file with it:
    no one but its writer could remove it from the sticky spool."""
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4k,mode=1733", "none", spool], check=True)
    try:
        with pytest.raises(OSError) as err:
            on_death(["true", "x" * (HOOK_MAX_BYTES // 2)])
        assert err.value.errno == errno.ENOSPC
        assert os.listdir(spool) == []
    finally:
        subprocess.run(["umount", spool], check=True)


def test_the_index_holds_a_bounded_number_of_hooks_per_user_and_no_argv(
    spool, dead_owner, tmp_path, caplog, attacker
):
    over = 2
    for n in range(MAX_PER_UID + over):
        plant(spool, n, body(dead_owner, ["true"]))
    big = ["true", "x" * (HOOK_MAX_BYTES // 2)]
    plant(spool, "f" * 32, body(dead_owner, big), user=attacker)  # another user's count
    caplog.set_level(logging.WARNING)
    found = Hooks(str(spool)).scan().resources
    by_uid = collections.Counter(h.uid for h in found)
    assert by_uid == {0: MAX_PER_UID, attacker.pw_uid: 1}
    capped = [r.getMessage() for r in caplog.records if "more than" in r.getMessage()]
    assert len(capped) == over
    # What the index keeps of a hook is small, whatever its command: the run reads it anew.
    [mine] = [h for h in found if h.uid == attacker.pw_uid]
    assert all(len(repr(getattr(mine, f.name))) <= 300 for f in dataclasses.fields(mine))


def test_bad_hooks_are_refused_with_a_warning_and_never_run(
    spool, dead_owner, tmp_path, caplog, attacker, every_warning
):
    canary = tmp_path / "ran"
    good = body(dead_owner, ["touch", str(canary)])
    elsewhere = plant(tmp_path, "elsewhere", good)
    linked = plant(tmp_path, "linked", good)

    def hook_with(make):
        """A hook directory whose hook.json `make` makes."""
        return lambda d: (d.mkdir(mode=0o700), make(d / HOOK_FILE))

    def write(path: Path, content: dict | bytes, mode: int = 0o600) -> None:
        path.write_bytes(content if isinstance(content, bytes) else json.dumps(content).encode())
        os.chmod(path, mode)

    def chown(d: Path, uid: int, file_uid: int | None = None) -> None:
        os.chown(d, uid, uid)
        os.chown(d / HOOK_FILE, uid if file_uid is None else file_uid, uid)

    cases = {
        "a symlink": lambda d: d.symlink_to(elsewhere.parent),
        "a FIFO": lambda d: os.mkfifo(d, 0o600),
        "a socket": lambda d: socket.socket(socket.AF_UNIX).bind(str(d)),
        "a flat file of the old layout": lambda d: write(d.with_suffix(".json"), good),
        "a directory others may write to": lambda d: (plant(spool, d.name, good), d.chmod(0o730)),
        "badly named": lambda d: plant(spool, d.name + "-x", good),
        "a symlink for its file": hook_with(lambda f: f.symlink_to(elsewhere)),
        "a FIFO for its file": hook_with(lambda f: os.mkfifo(f, 0o600)),
        "a hard link for its file": hook_with(lambda f: os.link(linked, f)),
        "a world-writable file": hook_with(lambda f: write(f, good, 0o606)),
        "a group-writable file": hook_with(lambda f: write(f, good, 0o620)),
        "too large": hook_with(
            lambda f: write(f, body(dead_owner, ["touch", str(canary), "x" * HOOK_MAX_BYTES]))
        ),
        "not JSON": hook_with(lambda f: write(f, b'{"owner": ')),
        "a bad owner": hook_with(lambda f: write(f, good | {"owner": "1:2:3"})),
        "of a uid with no passwd entry": lambda d: (plant(spool, d.name, good), chown(d, 54321)),
        "root's file in a user's directory": lambda d: (
            plant(spool, d.name, good),
            chown(d, attacker.pw_uid, 0),
        ),
    }
    kind = Hooks(str(spool))
    caplog.set_level(logging.WARNING)
    for n, make in enumerate(cases.values()):
        make(spool / hook_id(n))
    snapshot = kind.scan()
    assert snapshot.resources == ()
    warned = " ".join(r.getMessage() for r in caplog.records)
    for n, what in enumerate(cases):
        odd = {"a flat file of the old layout": f"{hook_id(n)}.json", "badly named": "-x"}
        name = odd.get(what, hook_id(n)).replace("-x", f"{hook_id(n)}-x")
        assert f"{spool / name}: refused" in warned, what
    # Found while good, turned bad before it ran: the last look refuses it too.
    path = plant(spool, 99, good)
    [hook] = kind.scan().resources
    os.chmod(path, 0o622)
    [outcome] = kind.reap(dead_owner, [hook], dry_run=False)
    assert outcome.refused and "writable by group or others" in outcome.detail
    os.chmod(path, 0o600)
    os.chown(path, attacker.pw_uid, attacker.pw_gid)  # not its directory's owner's
    [outcome] = kind.reap(dead_owner, [hook], dry_run=False)
    assert outcome.refused and "belongs to uid" in outcome.detail
    os.chown(path.parent, attacker.pw_uid, attacker.pw_gid)  # another uid than was found
    [outcome] = kind.reap(dead_owner, [hook], dry_run=False)
    assert outcome.refused and "replaced" in outcome.detail
    assert not canary.exists()


@pytest.mark.parametrize("over", ["its file", "its directory"])
@pytest.mark.parametrize("source", ["same filesystem", "tmpfs"])
def test_a_mount_over_a_users_hook_is_refused(spool, dead_owner, tmp_path, attacker, source, over):
    """A user who can mount over their own hook (FUSE with user_allow_other) answers
    root's fstat as they like: uid 0, one link, mode 0600. A bind mount of root's own
    file (or directory) plays that part here (no FUSE on the test machine): from the
    spool's own filesystem (the device is the same, the mount is not), and from a tmpfs."""
    canary = tmp_path / "ran"
    hook_file = plant(spool, 5, body(dead_owner, ["touch", str(canary)]), user=attacker)
    kind = Hooks(str(spool))
    [found] = kind.scan().resources  # the user's own hook, found before the mount
    host = tmp_path / "host"
    host.mkdir()
    mounts = []
    try:
        if source == "tmpfs":
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "none", host], check=True)
            mounts.append(host)
        roots = plant(host, "roots", body(dead_owner, ["touch", str(canary)]))
        target = hook_file if over == "its file" else hook_file.parent
        subprocess.run(["mount", "--bind", roots if over == "its file" else roots.parent, target])
        mounts.insert(0, target)
        assert target.stat().st_uid == 0  # what root's checks now see
        assert kind.scan().resources == ()
        [outcome] = kind.reap(dead_owner, [found], dry_run=False)
        assert outcome.refused and "mounted over" in outcome.detail, outcome
        assert not canary.exists()
    finally:
        for path in mounts:
            subprocess.run(["umount", path], check=True)


def test_a_hung_hook_is_killed_with_its_children_after_its_timeout(spool, dead_owner, tmp_path):
    pids, leader, quick = tmp_path / "pids", tmp_path / "leader", tmp_path / "quick"
    script = f"sleep 1000 & echo $! > {pids}; echo $$ > {leader}.tmp; mv {leader}.tmp {leader}"
    timeout = 3
    hung = plant(spool, 1, body(dead_owner, ["sh", "-c", script + "; sleep 1000"], timeout=timeout))
    # The same owner's next hook does not wait for the hung one: they run side by side, so
    # it sees the hung one running (run after it, it would find it killed; run before it,
    # it would wait for it in vain and fail).
    seen = (
        f"for i in $(seq 300); do [ -s {leader} ] && break; sleep 0.1; done; "
        f'kill -0 "$(cat {leader})" && echo running > {quick}'
    )
    plant(spool, 2, body(dead_owner, ["sh", "-c", seen], timeout=60))
    kind = Hooks(str(spool))
    hooks = list(kind.scan().resources)
    started = time.monotonic()
    outcome, fine = side_by_side(kind, dead_owner, hooks)
    took = time.monotonic() - started
    assert fine.ok and quick.read_text() == "running\n", fine
    assert not outcome.ok and "timed out" in outcome.detail
    assert outcome.extra["hook"]["timed_out"] and outcome.counts == ("hook_runs", "hook_timeouts")
    # Killed at its timeout, not much later: a slow machine gets seconds, not a multiple.
    assert timeout <= took < timeout + 5, took
    child = int(pids.read_text())
    wait_for(lambda: state(child) in (None, "Z"), 30, "the hook's child to be killed")
    assert hung.exists()  # to be tried again


def test_a_hook_leaves_nothing_running_and_does_not_keep_the_agents_oom_score(
    spool, dead_owner, tmp_path
):
    pids, score = tmp_path / "pids", tmp_path / "score"
    script = f"cat /proc/self/oom_score_adj > {score}; sleep 300 & echo $! > {pids}; exit 0"
    plant(spool, 6, body(dead_owner, ["sh", "-c", script]))
    kind = Hooks(str(spool))
    adj = Path("/proc/self/oom_score_adj")
    before = adj.read_text()
    # The unit gives the agent -500, which children inherit; lowering it takes
    # CAP_SYS_RESOURCE, which the test machine may lack, so a raised score stands in.
    adj.write_text("300")
    try:
        [outcome] = kind.reap(dead_owner, list(kind.scan().resources), dry_run=False)
    finally:
        adj.write_text(before)
    assert outcome.ok, outcome
    assert score.read_text() == "0\n"
    child = int(pids.read_text())
    wait_for(lambda: state(child) in (None, "Z"), 10, "the hook's leftover sleep to be killed")


def test_a_hook_locked_by_another_runner_is_left_to_it_and_not_run_twice(
    spool, dead_owner, tmp_path
):
    """Whoever holds a hook's lock runs it: the other is told to look again later, at
    once (it holds no worker while the lock is held), and then finds it gone."""
    canary = tmp_path / "ran"
    path = plant(spool, 4, body(dead_owner, ["touch", str(canary)]))
    kind = Hooks(str(spool))
    [hook] = kind.scan().resources
    with path.open() as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # as `exitwatch reap` running it would
        started = time.monotonic()
        [outcome] = kind.reap(dead_owner, [hook], dry_run=False)
        assert time.monotonic() - started < 5  # not waited for
        assert outcome.busy and not outcome.refused and "holds its lock" in outcome.detail
        shutil.rmtree(path.parent)  # the other runner's hook succeeded: it removes it, unlocks
    [outcome] = kind.reap(dead_owner, [hook], dry_run=False)
    assert outcome.ok and "already gone" in outcome.detail, outcome
    assert not canary.exists()


def test_following_the_spool_reports_each_change(spool, dead_owner, tmp_path):
    """Hooks added, renamed and removed while the spool is followed: each event's names
    are looked at again, and only what changed is told."""
    changes: queue.SimpleQueue = queue.SimpleQueue()
    kind = Hooks(str(spool))
    kind.start(changes.put)

    def put(name: str, argv: list[str]) -> Path:
        plant(spool, f".{name}", body(dead_owner, argv))
        return (spool / f".{name}").rename(spool / name)  # as on_death writes a hook

    def next_change() -> Found | Gone:
        return changes.get(timeout=30)

    a, b, c = hook_id(10), hook_id(11), hook_id(12)
    try:
        assert changes.get(timeout=30).resources == ()
        put(a, ["echo", "a"])
        assert (found := next_change()).resource.key == a and "echo a" in found.resource.name
        put(b, ["echo", "b"])
        assert next_change().resource.key == b
        os.rename(spool / b, spool / c)
        told = {next_change(), next_change()}
        assert {type(c) for c in told} == {Found, Gone}
        [renamed] = [c for c in told if isinstance(c, Found)]
        assert renamed.resource.key == c and "echo b" in renamed.resource.name
        assert Gone("hook", b) in told
        shutil.rmtree(spool / a)
        assert next_change() == Gone("hook", a)
        assert changes.empty()
    finally:
        kind.stop()


def _following_one_hook(spool: Path, owner: Owner, name: str) -> tuple[Hooks, queue.SimpleQueue]:
    """A hook kind following `spool`, which holds the one hook `name`, past its Snapshot;
    the caller stops it."""
    changes: queue.SimpleQueue = queue.SimpleQueue()
    kind = Hooks(str(spool))
    plant(spool, name, body(owner, ["echo", "a"]))
    kind.start(changes.put)
    try:
        assert [r.key for r in changes.get(timeout=30).resources] == [name]
    except BaseException:
        kind.stop()
        raise
    return kind, changes


@pytest.mark.parametrize("gone", [False, True], ids=["no inotify", "spool moved"])
def test_without_inotify_the_spool_is_rescanned(spool, dead_owner, monkeypatch, caplog, gone):
    """No inotify instance to be had, or the spool itself moved away while followed: hook
    discovery says so once and lists the spool whole every POLL_INTERVAL."""
    if not gone:

        def refuse(self: object) -> None:
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))

        monkeypatch.setattr(inotify.Inotify, "__init__", refuse)
    kind, changes = _following_one_hook(spool, dead_owner, hook_id(30))
    b = hook_id(31)
    try:
        if gone:  # moved away and back: the watch went with it
            os.rename(spool, f"{spool}.away")
            os.rename(f"{spool}.away", spool)
            wait_for(lambda: "falls back" in caplog.text, what="the fallback")
        plant(spool, b, body(dead_owner, ["echo", "b"]))
        assert changes.get(timeout=30).resource.key == b
    finally:
        kind.stop()
    fallbacks = [r.getMessage() for r in caplog.records if "falls back" in r.getMessage()]
    why = "was removed or moved" if gone else os.strerror(errno.EMFILE)
    assert len(fallbacks) == 1 and why in fallbacks[0], fallbacks


class _FullFdTable:
    """os for contract.py, where the spool is opened (by the agent too), but opening the
    spool fails with EMFILE while `full`."""

    def __init__(self, spool: Path) -> None:
        self.spool, self.full = str(spool), threading.Event()

    def open(self, path, *args, **kw):
        if self.full.is_set() and path == self.spool:
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return os.open(path, *args, **kw)

    def __getattr__(self, name: str) -> object:
        return getattr(os, name)


def test_a_spool_that_cannot_be_listed_now_loses_no_hook(spool, dead_owner, monkeypatch):
    """A listing that failed (a full fd table) says nothing of the hooks: what was known
    stands, and the spool is listed whole again once it can be."""
    fake = _FullFdTable(spool)
    monkeypatch.setattr(contract, "os", fake)
    kind, changes = _following_one_hook(spool, dead_owner, hook_id(20))
    b = hook_id(21)
    try:
        fake.full.set()
        plant(spool, b, body(dead_owner, ["echo", "b"]))
        with pytest.raises(OSError, match="Too many open files"):
            kind.scan()
        with pytest.raises(queue.Empty):  # not Gone(a)
            changes.get(timeout=1.5)
        fake.full.clear()
        assert changes.get(timeout=30).resource.key == b
        assert changes.empty()
    finally:
        kind.stop()


def test_a_hook_refused_for_an_unknown_uid_is_looked_at_again(spool, dead_owner, tmp_path):
    """A user lookup that fails (NSS, LDAP for a moment) is not remembered until the file
    changes: a later listing of the spool looks again. Here the uid gains its entry."""
    # Held throughout: the uid stays free until this test adds it, and one session at a time
    # has the name (a session killed before its userdel left it: removed first).
    with users_database():
        name = "exitwatch-nss-test"
        subprocess.run(["userdel", name], capture_output=True, check=False)
        _unknown_uid_looked_at_again(spool, dead_owner, _free_uid(), name)


def _free_uid() -> int:
    return next(u for u in range(54329, 59999) if not _known(u))


def _known(uid: int) -> bool:
    with contextlib.suppress(KeyError):
        return bool(pwd.getpwuid(uid))
    return False


def _unknown_uid_looked_at_again(spool, dead_owner, uid: int, name: str) -> None:
    path = plant(spool, 7, body(dead_owner, ["true"])).parent
    os.chown(path / HOOK_FILE, uid, uid)
    os.chown(path, uid, uid)
    changes: queue.SimpleQueue = queue.SimpleQueue()
    kind = Hooks(str(spool))
    kind.start(changes.put)
    try:
        assert changes.get(timeout=30).resources == ()
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--uid", str(uid), name],
            check=True,
        )
        try:
            plant(spool, 8, body(dead_owner, ["true"]))  # any change lists again
            found = set()
            while path.name not in found:
                found.add(changes.get(timeout=30).resource.key)
        finally:
            subprocess.run(["userdel", name], check=True)
    finally:
        kind.stop()


def test_a_live_owners_hook_is_refused_at_run_time(spool, tmp_path):
    canary = tmp_path / "ran"
    owner = spawn_owner()
    try:
        plant(spool, 2, body(owner.owner, ["touch", str(canary)]))
        kind = Hooks(str(spool))
        [hook] = kind.scan().resources
        [outcome] = kind.reap(owner.owner, [hook], dry_run=False)
        assert outcome.refused and "alive" in outcome.detail
        assert not canary.exists()
    finally:
        kill(owner)


def test_a_hook_runs_where_its_user_may_go(spool, dead_owner, tmp_path, attacker):
    """The recorded directory is entered as the user: a symlink into a place the user
    cannot reach leads to HOME (here /nonexistent, so /) instead."""
    hidden = tmp_path / "hidden"
    (hidden / "inner").mkdir(parents=True)
    os.chmod(hidden, 0o700)
    out = Path(tempfile.mkdtemp(prefix="exitwatch-hook-out-"))
    os.chmod(out, 0o1777)
    try:
        (out / "door").symlink_to(hidden / "inner")
        for n, cwd in enumerate([str(out), str(out / "door")]):
            script = ["sh", "-c", f"pwd > {out}/{n}"]
            plant(spool, n, body(dead_owner, script, cwd=cwd), user=attacker)
        kind = Hooks(str(spool))
        outcomes = kind.reap(dead_owner, list(kind.scan().resources), dry_run=False)
        assert all(o.ok for o in outcomes), outcomes
        assert (out / "0").read_text() == f"{out}\n"
        assert (out / "1").read_text() in (f"{attacker.pw_dir}\n", "/\n")
    finally:
        shutil.rmtree(out)


def test_environment_and_death_are_handed_over_and_nothing_else(
    spool, dead_owner, tmp_path, monkeypatch
):
    env_out = tmp_path / "env"
    monkeypatch.setenv("EXITWATCH_AGENTS_OWN", "not for hooks")  # the agent's environment
    hid = on_death(["sh", "-c", f"env > {env_out}"], env={"SANDBOX": "sbx-9"})
    # Rewritten to a dead_owner owner, as the agent would find it after a SIGKILL.
    path = spool / hid / HOOK_FILE
    path.write_text(json.dumps(json.loads(path.read_text()) | {"owner": str(dead_owner)}))
    kind = Hooks(str(spool))
    [hook] = kind.scan().resources
    [outcome] = kind.reap(dead_owner, [hook], False, "killed by SIGKILL (process gone)")
    assert outcome.ok and outcome.key == hook.key
    env = dict(line.split("=", 1) for line in env_out.read_text().splitlines())
    assert env["SANDBOX"] == "sbx-9"
    assert env["EXITWATCH_DEAD_OWNER"] == str(dead_owner)
    assert env["EXITWATCH_DEATH"] == "killed by SIGKILL (process gone)"
    assert env["USER"] == "root" and env["HOME"] and env["PATH"] and env["LANG"]
    # The minimal set, the recorded env and the death, and what the shells add: no more.
    handed = {"PATH", "HOME", "USER", "LANG", "SANDBOX", "EXITWATCH_DEAD_OWNER", "EXITWATCH_DEATH"}
    assert handed <= env.keys() <= handed | {"PWD", "OLDPWD", "SHLVL", "_"}, env.keys()
    assert not path.exists() and not path.parent.exists()
    # Ran once: its file is gone, so the same resource never runs again.
    [again] = kind.reap(dead_owner, [hook], dry_run=False)
    assert again.ok and "already gone" in again.detail


def test_a_lone_surrogate_is_refused_with_a_warning(spool, dead_owner, tmp_path, caplog):
    """JSON may carry "\\ud800", which decodes to a str that exec cannot take."""
    canary = tmp_path / "ran"
    good = body(dead_owner, ["touch", str(canary)])
    bad = [
        good | {"argv": ["touch", str(canary), "\ud800"]},
        good | {"env": {"X": "\udfff"}},
        good | {"cwd": "/\ud800"},
    ]
    for n, content in enumerate(bad):
        plant(spool, n, content)
    caplog.set_level(logging.WARNING)
    assert Hooks(str(spool)).scan().resources == ()
    warned = [r.getMessage() for r in caplog.records]
    for n in range(len(bad)):
        [line] = [m for m in warned if hook_id(n) in m]
        assert "not valid UTF-8" in line
    assert not canary.exists()


def test_one_hook_that_raises_costs_the_others_nothing(
    spool, dead_owner, tmp_path, caplog, monkeypatch
):
    """A hook that raises where it runs (here a lone surrogate, let through as the shape
    check once did) gets one log line and a failed outcome; its sibling runs."""
    monkeypatch.setattr(Hooks, "fmt", dataclasses.replace(FORMAT, problem=lambda body: None))
    canary = tmp_path / "ran"
    plant(spool, 1, body(dead_owner, ["touch", str(canary), "\ud800"]))
    plant(spool, 2, body(dead_owner, ["touch", str(canary)]))
    kind = Hooks(str(spool))
    caplog.set_level(logging.WARNING)
    raising, fine = kind.reap(dead_owner, list(kind.scan().resources), dry_run=False)
    assert fine.ok and canary.exists(), fine
    assert not raising.ok and not raising.refused and "UnicodeEncodeError" in raising.detail
    assert raising.key == hook_id(1)
    [line] = [r for r in caplog.records if hook_id(1) in r.getMessage()]
    assert line.exc_info is None  # one line, no traceback


def _fuzzed(dead_owner: Owner, canary: Path) -> st.SearchStrategy[bytes]:
    """Hook files that are bad by construction, each for a reason of its own, so that the
    oracle owes nothing to the code under test: a good hook with one key dropped, one
    unknown key added, or one value that breaks the contract; anything but an object;
    random bytes."""
    good = body(dead_owner, ["touch", str(canary)])
    scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text()
    values = st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner),
        max_leaves=8,
    )
    # Text with lone surrogates, which JSON can carry and exec cannot take.
    surrogate = st.builds(
        lambda a, s, b: a + s + b, st.text(), st.integers(0xD800, 0xDFFF).map(chr), st.text()
    )
    not_str = values.filter(lambda v: not isinstance(v, str))
    not_number = values.filter(lambda v: isinstance(v, bool) or not isinstance(v, int | float))
    with_nul = st.builds(lambda a, b: f"{a}\0{b}", st.text(), st.text())
    bad_string = with_nul | surrogate
    bad = {
        # An owner is <boot id>:<pid>:<start time>: two colons, or it is not one.
        "owner": not_str | st.text().filter(lambda t: t.count(":") != 2) | surrogate,
        "argv": not_str.filter(lambda v: not isinstance(v, list))
        | st.just([])
        | st.builds(lambda rest: ["", *rest], st.lists(st.text(), max_size=2))
        | st.builds(lambda v: ["true", v], not_str)
        | st.builds(lambda v: ["true", v], bad_string),
        "cwd": not_str
        | st.text(min_size=1).filter(lambda t: not t.startswith("/"))
        | bad_string.map(lambda t: "/" + t),
        "env": not_str.filter(lambda v: not isinstance(v, dict))
        | st.builds(lambda k: {k: "v"}, st.text().filter(lambda k: not k.isidentifier()))
        | st.builds(lambda k: {f"{k}-": "v"}, st.from_regex(r"[A-Z_]{1,5}", fullmatch=True))
        | st.builds(lambda v: {"X": v}, not_str | bad_string),
        "timeout": not_number
        | st.floats(max_value=0)
        | st.floats(min_value=HOOK_MAX_TIMEOUT, exclude_min=True),
        "created": not_number,
    }
    changed = st.sampled_from(sorted(bad)).flatmap(
        lambda k: bad[k].map(lambda v, k=k: good | {k: v})
    )
    dropped = st.sampled_from(sorted(good)).map(lambda k: {x: good[x] for x in good if x != k})
    added = st.builds(lambda k, v: good | {k: v}, st.text().filter(lambda k: k not in good), values)
    not_object = values.filter(lambda v: not isinstance(v, dict))
    # A broken value is most of the contract to get right: it gets most of the examples.
    shapes = st.one_of(changed, changed, changed, dropped, added, not_object)
    return shapes.map(lambda v: json.dumps(v).encode()) | st.binary(max_size=300)


def test_fuzzed_hook_files_are_refused_and_never_run(
    spool, dead_owner, tmp_path, caplog, every_warning
):
    canary = tmp_path / "ran"
    kind = Hooks(str(spool))
    names = itertools.count()

    @EXAMPLES
    @given(data=_fuzzed(dead_owner, canary))
    def one(data: bytes) -> None:
        path = plant(spool, next(names), data)
        try:
            caplog.clear()
            assert kind.scan().resources == ()
            [why] = [
                r.getMessage().split(": refused: ", 1)[1]
                for r in caplog.records
                if f"{path.parent}: refused" in r.getMessage()
            ]
            # Handed to the runner anyway (as a stale index entry would be, the very file it
            # found), it refuses it again, for the same reason.
            st_, dir_st = path.stat(), path.parent.stat()
            name = path.parent.name
            fake = Entry(
                "hook", name, dead_owner, name, None, st_.st_uid, st_.st_ino, st_.st_dev,
                dir_st.st_ino,
            )  # fmt: skip
            [outcome] = kind.reap(dead_owner, [fake], dry_run=False)
            assert outcome.refused and outcome.detail == why, (outcome, why)
        finally:
            shutil.rmtree(path.parent)  # each example stands alone, a failing one too

    caplog.set_level(logging.WARNING)
    one()
    assert not canary.exists()


def test_the_runner_kills_on_timeout_even_a_group_leader_that_ignores_sigterm(
    spool, dead_owner, tmp_path
):
    script = "trap '' TERM; while :; do sleep 1; done"
    plant(spool, 3, body(dead_owner, ["sh", "-c", script], timeout=0.3))
    kind = Hooks(str(spool))
    [hook] = kind.scan().resources
    started = time.monotonic()
    [outcome] = kind.reap(dead_owner, [hook], dry_run=False)
    assert 0.3 <= time.monotonic() - started < 0.3 + 3  # at its timeout, not a multiple
    assert outcome.extra["hook"]["timed_out"]
    assert outcome.extra["hook"]["returncode"] == -signal.SIGKILL


def test_a_refusal_a_user_chose_is_read_once_and_one_that_may_pass_is_read_with_backoff(
    spool, dead_owner, monkeypatch
):
    """A socket bound as a hook's file stays refused until it changes: events about other
    entries never make the spool read it again (the review's F7: 1,024 of them cost every
    user's discovery 216 ms per event). A file that cannot be opened for want of fds is
    read again, later each time, and read whole once it can be."""
    sock_dir = spool / hook_id(1)
    sock_dir.mkdir(mode=0o700)
    with socket.socket(socket.AF_UNIX) as bound:
        bound.bind(str(sock_dir / HOOK_FILE))
        plant(spool, 2, body(dead_owner, ["true"]))
        reads: collections.Counter[str] = collections.Counter()
        real_read, real_open, emfile, reading = hookspool.read_entry, os.open, [True], [""]

        def counted(fmt, kind: str, dir_fd: int, name: str):
            reads[name] += 1
            reading[0] = name
            try:
                return real_read(fmt, kind, dir_fd, name)
            finally:
                reading[0] = ""

        def full_table(path, *args, **kwargs):  # hook 2's file, while the table is "full"
            if path == HOOK_FILE and reading[0] == hook_id(2) and emfile[0]:
                raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
            return real_open(path, *args, **kwargs)

        monkeypatch.setattr(hookspool, "read_entry", counted)
        monkeypatch.setattr(hookspool, "AGAIN_FIRST", 0.2)
        monkeypatch.setattr(os, "open", full_table)
        listing = hookspool.Spool(FORMAT, KIND, str(spool))
        assert listing.list() == {}
        assert reads == {hook_id(1): 1, hook_id(2): 1}
        for _ in range(20):  # a burst of events about a dot-file
            listing.list({".elsewhere"})
        assert reads[hook_id(1)] == 1  # the socket: never read again while it stays
        assert reads[hook_id(2)] == 1  # the fd table: not before its time either
        due = listing.next_again()
        assert due is not None and due - time.monotonic() <= 0.2
        wait_for(lambda: time.monotonic() >= due, what="the first look again due")
        listing.list(set())
        assert reads[hook_id(2)] == 2
        later = listing.next_again()
        assert later is not None and later - time.monotonic() > 0.3  # twice as long now
        emfile[0] = False
        wait_for(lambda: time.monotonic() >= later, what="the second look again due")
        assert set(listing.list(set())) == {hook_id(2)}
        assert reads[hook_id(1)] == 1 and listing.next_again() is None


def test_discovery_looks_again_by_itself_at_a_hook_it_could_not_open(
    spool, dead_owner, monkeypatch
):
    """A hook whose file could not be opened for want of fds is found once it can be, by
    the discovery thread's own timer: no other change in the spool has to come first."""
    real_open, full, failed = os.open, [True], threading.Event()

    def full_table(path, *args, **kwargs):
        if path == HOOK_FILE and full[0] and threading.current_thread().name == "exitwatch-hooks":
            failed.set()
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(hookspool, "AGAIN_FIRST", 0.2)
    monkeypatch.setattr(os, "open", full_table)
    changes: queue.SimpleQueue = queue.SimpleQueue()
    kind = Hooks(str(spool))
    kind.start(changes.put)
    try:
        assert changes.get(timeout=30).resources == ()
        hook = plant(spool, 9, body(dead_owner, ["true"])).parent
        wait_for(failed.is_set, what="the hook's file refused for want of fds")
        full[0] = False
        assert changes.get(timeout=10).resource.key == hook.name
    finally:
        kind.stop()
