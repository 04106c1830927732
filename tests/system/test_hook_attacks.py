"""The attacks of issue 18 on on-death hooks, against a real agent (without an engine: its
only work is the spool) and real users: `exitwatch-test` (A), and two users made for the
module (B, C). Each is docs/reliability.md's "Issue 18: on-death hooks"."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from exitwatch import on_death
from exitwatch.contract import ENV_HOOK_DIR, HOOK_FILE
from exitwatch.kinds.hooks.kind import Hooks

from support.agentproc import NO_LEFTOVERS, Agent
from support.hooks import REPO, body, engineless_agent, hook_id, register_as
from support.procs import killed_owner, wait_for
from support.users import SYSTEM_PYTHON, as_user, temporary_user

DEADLINE = 30.0  # for a correct agent on a loaded machine
PROMPT = 2.0  # how soon another user's hook starts while one user's hooks hog the agent
# The promises of docs/hooks.md, not the modules' constants (which a mutant changes too):
PER_USER = 8  # hooks of one user at a time
WARN_LINES, WARN_INTERVAL = 5, 60.0  # refusal warnings of one user, then a line counting more


@pytest.fixture(scope="module")
def other_user() -> Iterator:
    with temporary_user() as user:
        yield user


@pytest.fixture(scope="module")
def third_user() -> Iterator:
    with temporary_user("exitwatch-u") as user:
        yield user


@pytest.fixture
def agent_for(spool, tmp_path) -> Iterator:
    """Start real agents on the test's spool (or another), with extra arguments; stopped
    after."""
    started: list[Agent] = []
    root = tmp_path / "workdirs"
    root.mkdir()

    def start(*extra: str, on: Path = spool, until: str = "following hooks in") -> Agent:
        started.append(engineless_agent(on, root, tmp_path, *extra, until=until))
        return started[-1]

    yield start
    for agent in started:
        agent.stop()


def run_as(user, script: str, *args: str) -> subprocess.CompletedProcess:
    proc = as_user(user, script, *args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    stdout, stderr = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(script, proc.returncode, stdout.decode(), stderr.decode())


# -- 7. who put a file in the spool: a rename keeps its owner --------------------------------


def _tarball(path: Path, members: dict[str, tuple[int, bytes | None]]) -> None:
    """A tarball whose members (name: (mode, content, or None for a directory)) claim uid
    0, as a user's own tarball may: tar(1) as root restores that owner."""
    with tarfile.open(path, "w") as tar:
        for name, (mode, content) in members.items():
            info = tarfile.TarInfo(name)
            info.uid = info.gid = 0
            info.mode = mode
            info.mtime = int(time.time())
            if content is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))


def test_root_owned_files_a_user_moves_into_the_spool_never_run(
    spool, attacker, agent_for, out, tmp_path
):
    """Root unpacks a user's tarball (members claiming uid 0) into the user's directory;
    the user moves what it holds into the spool: as a file of the old layout, into a hook
    directory of their own, and as whole directories. Nothing runs as root (it would
    write a root-owned file where the user cannot), and each is refused by name."""
    proof = tmp_path / "proof"  # root's 0700 tmp_path: the user cannot write here
    proof.mkdir()
    evil = json.dumps(body(killed_owner(), ["sh", "-c", f"id -u > {proof}/pwned"])).encode()
    home = Path(tempfile.mkdtemp(prefix="exitwatch-home-"))
    try:
        os.chown(home, attacker.pw_uid, attacker.pw_gid)
        _tarball(
            tmp_path / "theirs.tar",  # made by root here, theirs in the story
            {
                "evil.json": (0o600, evil),
                "hook.json": (0o600, evil),
                "rootdir": (0o700, None),
                "rootdir/hook.json": (0o600, evil),
                "opendir": (0o777, None),
                "opendir/hook.json": (0o600, evil),
            },
        )
        tar = tmp_path / "theirs.tar"
        subprocess.run(["tar", "-x", "--same-owner", "-p", "-C", home, "-f", tar], check=True)
        assert (home / "hook.json").stat().st_uid == 0 == (home / "rootdir").stat().st_uid
        agent = agent_for()
        flat, own, whole, loose = (hook_id(n) for n in (1, 2, 3, 4))
        moved = run_as(
            attacker,
            # Into a directory of their own made as on_death makes one, renamed into place
            # whole (one made in place is read at the next whole listing, to the same end).
            'set -e; cd "$1"; mv evil.json "$2/$3.json"; mkdir -m 700 "$2/.$4"; '
            'mv hook.json "$2/.$4/hook.json"; mv "$2/.$4" "$2/$4"; mv opendir "$2/$6"; '
            'if mv rootdir "$2/$5"; then echo moved; else echo refused; fi',
            str(home),
            str(spool),
            flat,
            own,
            whole,
            loose,
        )
        assert moved.returncode == 0, moved.stderr
        # The kernel itself refuses: a directory changes parents only with write on it.
        assert moved.stdout.strip() == "refused" and "Permission denied" in moved.stderr
        assert (spool / own / HOOK_FILE).stat().st_uid == 0  # root's file, the user's directory
        refusals = [
            f"hook {spool / name}: refused: {why}"
            for name, why in [
                (f"{flat}.json", "it is a hook file directly in the spool"),
                (own, f"its hook.json belongs to uid 0, not to uid {attacker.pw_uid}"),
                (loose, "its directory is writable by group or others (mode 0777)"),
            ]
        ]
        wait_for(
            lambda: (proof / "pwned").exists() or all(r in agent.text() for r in refusals),
            DEADLINE,
            "each to be refused",
        )
        assert not (proof / "pwned").exists()
        # The user's own hook runs all the same, as the user.
        register_as(attacker, spool, [f"touch {out}/canary"])
        wait_for((out / "canary").exists, DEADLINE, "the user's own hook to run")
        assert (out / "canary").stat().st_uid == attacker.pw_uid
        assert not (proof / "pwned").exists()
    finally:
        shutil.rmtree(home)


def test_a_users_move_of_another_users_files_never_runs_as_them(
    spool, attacker, other_user, agent_for, out
):
    """B unpacks A's tarball into a directory of A's that B may write to: the file and
    the directory are B's, their content A's. A moves the file into a hook directory of
    A's own, and tries to move the directory into the spool. Nothing runs as B."""
    a, b = attacker, other_user
    shared = Path(tempfile.mkdtemp(prefix="exitwatch-shared-"))
    try:
        os.chown(shared, a.pw_uid, a.pw_gid)
        os.chmod(shared, 0o777)  # A's, open to B
        as_b = json.dumps(body(killed_owner(), ["sh", "-c", f"id -u > {out}/as-b"]))
        made = run_as(
            b,
            'set -e; umask 022; cd "$1"; printf %s "$2" > b.json; mkdir bdir; '
            'printf %s "$2" > bdir/hook.json; chmod 600 b.json bdir/hook.json',
            str(shared),
            as_b,
        )
        assert made.returncode == 0, made.stderr
        agent = agent_for()
        own, whole = hook_id(5), hook_id(6)
        moved = run_as(
            a,
            'cd "$1" && mkdir -m 700 "$2/.$3" && mv b.json "$2/.$3/hook.json" && '
            'mv "$2/.$3" "$2/$3" || exit 2; '
            'if mv bdir "$2/$4"; then echo moved; else echo refused; fi',
            str(shared),
            str(spool),
            own,
            whole,
        )
        assert moved.returncode == 0, moved.stderr
        assert moved.stdout.strip() == "refused" and "Permission denied" in moved.stderr
        assert (spool / own / HOOK_FILE).stat().st_uid == b.pw_uid
        why = f"its hook.json belongs to uid {b.pw_uid}, not to uid {a.pw_uid}"
        refusal = f"hook {spool / own}: refused: {why}"
        wait_for(
            lambda: (out / "as-b").exists() or refusal in agent.text(), DEADLINE, "the refusal"
        )
        assert not (out / "as-b").exists()
        register_as(a, spool, [f"touch {out}/a-canary"])
        wait_for((out / "a-canary").exists, DEADLINE, "A's own hook to run")
        assert not (out / "as-b").exists()
    finally:
        shutil.rmtree(shared)


# -- 8. one user's hooks and everyone else's ------------------------------------------------


def _started(out: Path, prefix: str) -> int:
    return sum(1 for p in out.iterdir() if p.name.startswith(prefix))


def test_one_users_sixteen_hooks_leave_room_for_anothers(
    spool, attacker, other_user, agent_for, out
):
    """A's 16 hooks (16 dead owners), each holding on until released: PER_UID (8) run,
    the other 8 wait holding no worker, and B's hook starts at once."""
    agent = agent_for()
    hold = f'while [ ! -e {out}/release ]; do sleep 0.1; done; touch "{out}/done-$$"'
    scripts = [f"touch {out}/a-{n}; {hold}" for n in range(16)]
    register_as(attacker, spool, scripts, timeout=120)
    try:
        wait_for(lambda: _started(out, "a-") >= PER_USER, DEADLINE, "A's first hooks")
        registered = time.monotonic()
        register_as(other_user, spool, [f"touch {out}/b-0"])
        wait_for((out / "b-0").exists, DEADLINE, "B's hook")
        took = time.monotonic() - registered
        print(f"B's hook started {took:.2f} s after it was registered")
        assert _started(out, "a-") == PER_USER  # never more of one user at once
        assert took < PROMPT, f"B's hook started {took:.1f} s after it was registered"
        pending = [p for p in agent.status()["pending"] if p["kind"] == "hook"]
        assert sorted(p["state"] for p in pending).count("waiting for a slot") == 8
        assert _started(out, "a-") == PER_USER
    finally:
        (out / "release").touch()
    wait_for(lambda: _started(out, "done-") == 16, DEADLINE, "all of A's hooks to run")
    assert _started(out, "a-") == 16
    wait_for(lambda: not os.listdir(spool), DEADLINE, "every hook gone")


# -- 9. a user's locks on their own hooks ---------------------------------------------------

# As the user: registers argv[5] hooks (each writing to argv[4]-N), each owned by a child
# of its own, locks each hook's file (theirs: they may), kills the owners and holds the
# locks until stdin closes.
_HOLD_LOCKS = """
import fcntl, json, os, subprocess, sys
sys.path.insert(0, sys.argv[1])
from exitwatch import on_death
spool, out, who, n = sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
children = [subprocess.Popen(["sleep", "1000"]) for _ in range(n)]
held = []
for i, child in enumerate(children):
    hid = on_death(["sh", "-c", f"echo ran >> {out}/{who}-{i}"], pid=child.pid)
    held.append(open(os.path.join(spool, hid, "hook.json")))
    fcntl.flock(held[-1], fcntl.LOCK_EX)
for child in children:
    child.kill()
    child.wait()
print("locked", flush=True)
sys.stdin.read()
"""


def test_users_locks_on_their_own_hooks_hold_up_no_one_else(
    spool, attacker, other_user, third_user, agent_for, out
):
    """A and C each hold flock on 16 of their hook files, whose owners are dead (waited
    for on workers, they would fill both users' lanes). The agent does not wait for those
    locks on its workers: B's hook starts at once, so does an unlocked hook of A's, and
    A's and C's locked ones run once their locks go, having spent no attempt on them
    (reap_attempts = 3: 0.5 s and 2 s apart)."""
    agent = agent_for()
    holders = [
        as_user(
            user,
            f'cd /tmp && exec {SYSTEM_PYTHON} -I -S -c "$@"',
            _HOLD_LOCKS,
            str(REPO),
            str(spool),
            str(out),
            name,
            "16",
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={ENV_HOOK_DIR: str(spool), "PATH": "/usr/bin:/bin"},
        )
        for user, name in [(attacker, "a"), (third_user, "c")]
    ]
    try:
        for holder in holders:
            assert holder.stdout is not None and holder.stdout.readline() == b"locked\n"

        def busy() -> list:
            pending = [p for p in agent.status()["pending"] if p["kind"] == "hook"]
            return len(pending) == 32 and all(p["attempt"] == 1 for p in pending) and pending

        wait_for(busy, DEADLINE, "the 32 hooks found locked")
        registered = time.monotonic()
        register_as(other_user, spool, [f"touch {out}/b-0"])
        wait_for((out / "b-0").exists, DEADLINE, "B's hook")
        took = time.monotonic() - registered
        print(f"B's hook started {took:.2f} s after it was registered")
        assert took < PROMPT, f"B's hook started {took:.1f} s after it was registered"
        # Nor do A's locked hooks hold A's own slots: a hook of A's that is not locked runs
        # at once too (waited for on workers, they would fill A's lane).
        registered = time.monotonic()
        register_as(attacker, spool, [f"touch {out}/free-0"])
        wait_for((out / "free-0").exists, DEADLINE, "A's unlocked hook")
        assert time.monotonic() - registered < PROMPT
        time.sleep(3)  # past every retry of an attempt-spending failure (0.5 s + 2 s)
        assert _started(out, "a-") == _started(out, "c-") == 0 and busy()
    finally:
        for holder in holders:
            holder.communicate(timeout=30)  # closes stdin: the locks go
    wait_for(lambda: _started(out, "a-") == 16, DEADLINE, "A's hooks to run once unlocked")
    wait_for(lambda: _started(out, "c-") == 16, DEADLINE, "C's hooks to run once unlocked")
    wait_for(lambda: not os.listdir(spool), DEADLINE, "every hook gone")
    ran = [(out / f"{who}-{n}").read_text() for who in "ac" for n in range(16)]
    assert ran == ["ran\n"] * 32  # once each
    assert "giving up" not in agent.text()


# -- 10. many bad entries of one user --------------------------------------------------------

# As the user: argv[2] flat files of the old layout and as many empty hook directories.
_FLOOD = """
import os, sys
spool, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    fd = os.open(os.path.join(spool, f"{i:032x}.json"), os.O_WRONLY | os.O_CREAT, 0o600)
    os.close(fd)
    os.mkdir(os.path.join(spool, f"{n + i:032x}"), 0o700)
"""


def _rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^VmRSS:\s+(\d+) kB", status, re.M).group(1))


def test_forty_thousand_bad_entries_of_one_user_cost_little_and_say_little(
    spool, attacker, other_user, agent_for, out, tmp_path
):
    """A fills the spool with 20,000 files of the old layout and 20,000 empty hook
    directories. The agent's memory grows by little, its log by a few lines per minute,
    across whole listings (a reconcile every second), and B's hook still runs."""
    config = tmp_path / "config.toml"
    config.write_text(NO_LEFTOVERS + "reconcile_interval = 1\n")
    agent = agent_for("--config", str(config))
    agent.wait_log("reconcile: listed", count=2)
    before = _rss_kib(agent.pid)
    started = time.monotonic()
    flood = as_user(
        attacker, f'exec {SYSTEM_PYTHON} -I -S -c "$1" "$2" "$3"', _FLOOD, str(spool), "20000"
    )
    assert flood.wait(timeout=300) == 0
    assert len(os.listdir(spool)) == 40_000
    # Listed whole twice since (every entry looked at), then B's hook runs.
    reconciles = agent.text().count("reconcile: listed")
    agent.wait_log("reconcile: listed", count=reconciles + 2)
    register_as(other_user, spool, [f"touch {out}/b-0"])
    wait_for((out / "b-0").exists, DEADLINE, "B's hook")
    after = _rss_kib(agent.pid)
    windows = 1 + int((time.monotonic() - started) // WARN_INTERVAL)
    lines = agent.text().splitlines()
    refused = [x for x in lines if "WARNING" in x and ": refused: " in x]
    summaries = [x for x in lines if f"more entries of uid {attacker.pw_uid} refused" in x]
    assert len(refused) <= WARN_LINES * windows, len(refused)
    assert 1 <= len(summaries) <= 2 * windows, summaries
    assert after - before < 4 * 1024, f"RSS {before} kB -> {after} kB"
    print(f"RSS {before} -> {after} kB; {len(refused)} + {len(summaries)} lines")


# -- 11. a symlinked spool --------------------------------------------------------------------


def test_a_symlinked_spool_is_refused_by_both_sides_in_the_same_words(
    spool, tmp_path, agent_for, monkeypatch
):
    """on_death once followed the link and accepted hooks that the agent, refusing the
    link, never ran. Both open the spool with O_NOFOLLOW now, and say the same line; the
    command adds what to do."""
    link = tmp_path / "link"
    link.symlink_to(spool)
    why = (
        f"hook spool {link}: it is a symlink, not a directory owned by root; "
        "others could tamper with hooks"
    )
    monkeypatch.setenv(ENV_HOOK_DIR, str(link))
    with pytest.raises(PermissionError, match="it is a symlink"):
        on_death(["true"])
    done = subprocess.run(
        [sys.executable, "-m", "exitwatch", "on-death", "--", "true"],
        capture_output=True,
        text=True,
    )
    todo = (
        "it must be a directory of root's, mode 1733, as the agent makes it (or set "
        f"{ENV_HOOK_DIR} to the agent's [hooks] dir)"
    )
    assert (done.returncode, done.stderr) == (1, f"Error: {why}: {todo}\n")
    with pytest.raises(ValueError) as err:
        Hooks(str(link)).scan()  # as `exitwatch reap` and `status` list it
    assert str(err.value) == why
    agent = agent_for(on=link, until="no hook runs")
    assert f"{why}; no hook runs" in agent.text()
    assert os.listdir(spool) == []
