"""Attacks on workdir removal through a real agent: the attacker is an unprivileged user
(setpriv) whose own process owns a marked workdir under a world-writable root, and who dies
by SIGKILL. tests/system/test_workdirs.py attacks the removal code directly; here the whole agent
path is attacked: discovery, the death, the removal. The victim's checksum never changes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from exitwatch.contract import MARKER, mark_workdir
from exitwatch.kinds.workdirs.kind import Workdirs
from exitwatch.owner import Owner, owner_of

from support.agentproc import NO_LEFTOVERS, Agent, quiet_config, running
from support.procs import kill, spawn_owner, wait_for
from support.trees import digest, lazy_umount_below
from support.users import SYSTEM_PYTHON, as_user, swapping_as

# Reads its owner string, builds its workdir as the attacker, then execs sleep: the same
# process, so the owner stays valid until it is killed.
_OWNER = (
    'read owner; cd "$1"; shift; body="{\\"owner\\": \\"$owner\\"}"; {setup}\n'
    "echo ready; exec sleep 1000000"
)


class AttackerOwner:
    """A process of the attacker's that owns what `setup` (shell, in the root) builds."""

    def __init__(self, user, root: Path, setup: str, *args: str) -> None:
        self.proc = as_user(
            user,
            _OWNER.replace("{setup}", setup),
            str(root),
            *args,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self.owner: Owner = owner_of(self.proc.pid)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{self.owner}\n".encode())
        self.proc.stdin.close()
        if self.proc.stdout.readline() != b"ready\n":
            raise AssertionError(f"the attacker's setup failed: {setup!r}")

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.proc.stdout.close()


@pytest.fixture
def root() -> Iterator[Path]:
    top = tempfile.mkdtemp(prefix="exitwatch-attack-")
    os.chmod(top, 0o1777)
    try:
        yield Path(top)
    finally:
        # rmtree would descend into a bind mount and wipe the victim.
        lazy_umount_below(top)
        shutil.rmtree(top)


@pytest.fixture
def agent(engine, root, tmp_path) -> Iterator[Agent]:
    with running(engine, root, tmp_path / "agent.log") as proc:
        yield proc


def outcome(agent: Agent, path: Path) -> str:
    """Wait for the agent's record of what it did with workdir `path`; that line."""
    needle = f" workdir {path} owner="
    agent.wait_log(needle, f"an outcome for {path}")
    return next(line for line in agent.text().splitlines() if needle in line)


ODD_NAMES = [
    "..\\..",
    "...",
    " ",
    "-rf",
    "*",
    "new\nline",
    "x" * 255,
    "\\tmp\\victim",
    "é\u202etxt.exe",
]


def test_links_and_odd_names_in_a_dead_attackers_workdir(agent, root, victim, attacker):
    before = digest(victim)
    setup = (
        'victim=$1; shift; mkdir wd && cd wd && ln -s "$victim" dir-link'
        ' && ln -s "$victim/precious" file-link && mkdir -p nested/deeper'
        ' && ln -s "$victim/sub" nested/deeper/sub-link && ln -s ../../.. up'
        ' && for n in "$@"; do mkdir -p "odd/$n" && touch "odd/$n/f"; done'
        ' && printf %s "$body" > .exitwatch-owner'
    )
    owner = AttackerOwner(attacker, root, setup, str(victim), *ODD_NAMES)
    wd = root / "wd"
    assert {p.name for p in (wd / "odd").iterdir()} == set(ODD_NAMES)
    # protected_hardlinks stops the attacker linking a root file; a file it could link
    # (world-writable, or on a host without the sysctl) is linked here by root.
    os.link(victim / "precious", wd / "hard-link")
    owner.kill()
    assert "reaped workdir" in outcome(agent, wd)
    assert not wd.exists()
    assert digest(victim) == before
    assert os.stat(victim / "precious").st_nlink == 1


def test_bind_mount_inside_a_dead_attackers_workdir(agent, root, victim, attacker):
    before = digest(victim)
    owner = AttackerOwner(
        attacker, root, 'mkdir -p wd/mnt && touch wd/other && printf %s "$body" > wd/' + MARKER
    )
    # The attacker cannot mount; a runtime that bind-mounted into its workdir and died can.
    subprocess.run(["mount", "--bind", str(victim), str(root / "wd" / "mnt")], check=True)
    owner.kill()
    line = outcome(agent, root / "wd")
    assert "refused workdir" in line and "mount point" in line
    assert digest(victim) == before


def test_markers_in_someone_elses_directory_and_in_the_root(agent, root, attacker):
    shared = root / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    os.chown(shared, 4242, 4242)
    (shared / "keep").write_text("theirs")
    (root / "neighbour").mkdir()
    (root / "neighbour" / "keep").write_text("theirs too")
    owner = AttackerOwner(
        attacker,
        root,
        'printf %s "$body" > shared/.exitwatch-owner && printf %s "$body" > .exitwatch-owner'
        ' && mkdir mine && printf %s "$body" > mine/.exitwatch-owner',
    )
    before = digest(root)
    owner.kill()
    # Its own workdir goes: the agent has acted on the death by then.
    assert "reaped workdir" in outcome(agent, root / "mine")
    line = outcome(agent, root / "shared")
    assert "refused workdir" in line and "uid" in line
    assert (shared / "keep").read_text() == "theirs"
    assert (root / "neighbour" / "keep").read_text() == "theirs too"
    assert (root / MARKER).exists(), "a root is never a workdir"
    assert root.is_dir() and digest(root) != before  # only "mine" went
    assert not (root / "mine").exists()


# Swaps the workdir, or a directory in it, for a symlink to the victim and back, forever.
_SWAPPER = r"""
import os, sys
wd, victim = sys.argv[1], sys.argv[2]
sub, wd_real, sub_real = wd + "/sub", wd + ".real", wd + "/sub.real"
print(os.getpid(), flush=True)
n = 0
while True:
    n += 1
    try:
        if n % 2:
            os.rename(sub, sub_real); os.symlink(victim, sub)
            os.unlink(sub); os.rename(sub_real, sub)
        else:
            os.rename(wd, wd_real); os.symlink(victim, wd)
            os.unlink(wd); os.rename(wd_real, wd)
    except OSError:
        pass
"""


def test_workdir_swapped_for_a_symlink_during_removal(agent, root, victim, attacker):
    for i in range(8):
        wd = root / f"wd{i}"
        setup = (
            f'mkdir -p wd{i}/sub/a && touch wd{i}/sub/a/$(seq -s " wd{i}/sub/a/" 200)'
            f' && printf %s "$body" > wd{i}/.exitwatch-owner'
        )
        owner = AttackerOwner(attacker, root, setup)
        # The bait: the victim, too, carries this owner's marker.
        (victim / MARKER).write_text(json.dumps({"owner": str(owner.owner)}))
        before = digest(victim)
        swapper = swapping_as(attacker, _SWAPPER, wd, victim)
        try:
            assert swapper.stdout is not None and swapper.stdout.readline().strip()
            owner.kill()
            wait_for(
                lambda wd=wd: (
                    f" workdir {wd} owner=" in agent.text()
                    or f" workdir {wd}.real owner=" in agent.text()
                ),
                timeout=30,
                what=f"an outcome for {wd}",
            )
        finally:
            swapper.send_signal(signal.SIGKILL)
            swapper.wait()
            swapper.stdout.close()
        assert digest(victim) == before, f"iteration {i}: the victim changed"
        (victim / MARKER).unlink()


EXITWATCH = [sys.executable, "-m", "exitwatch"]


# A marker hides what lies below its directory only when it validly claims that directory.


def _victims_workdir(parent: Path, name: str) -> tuple[Path, object]:
    """A workdir of user 4242 (directory and marker), owned by a live process of its."""
    owner = spawn_owner()
    wd = parent / name
    wd.mkdir()
    (wd / "data").write_text("theirs")
    mark_workdir(wd, owner.pid)
    for path in (wd, wd / "data", wd / MARKER):
        os.chown(path, 4242, 4242)
    return wd, owner


@pytest.mark.parametrize("marker", ["garbage", "the attacker's own live owner"])
def test_a_marker_above_someone_elses_workdir_hides_nothing(agent, root, attacker, marker):
    shared = root / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    vwork, victim_owner = _victims_workdir(shared, "vwork")
    agent.wait_holding(victim_owner.pid, workdirs=1)
    body = "garbage" if marker == "garbage" else '"$body"'
    attacker_owner = AttackerOwner(attacker, root, f"printf %s {body} > shared/{MARKER}")
    if marker == "garbage":
        agent.wait_log("shared/.exitwatch-owner is not JSON")
    else:
        agent.wait_holding(attacker_owner.proc.pid, workdirs=1)
        agent.wait_log("shared/.exitwatch-owner belongs to uid")
    assert [str(vwork)] == next(
        o["workdirs"] for o in agent.status()["owners"] if o["pid"] == victim_owner.pid
    )
    assert str(vwork) in {r.key for r in Workdirs([str(root)]).scan().resources}
    kill(victim_owner)
    assert "reaped workdir" in outcome(agent, vwork)
    assert not vwork.exists() and (shared / MARKER).exists()
    attacker_owner.kill()


def test_a_nested_workdir_of_a_dead_owner_is_not_left_for_good(
    agent, root, attacker, engine, tmp_path
):
    outer = AttackerOwner(attacker, root, f'mkdir -p out/in && printf %s "$body" > out/{MARKER}')
    inner = AttackerOwner(
        attacker, root, f'touch out/in/data && printf %s "$body" > out/in/{MARKER}'
    )
    agent.wait_holding(outer.proc.pid, workdirs=1)
    # The inner owner lives when the outer one dies: its workdir stays, and so does the
    # outer one, marker included, to be found again.
    outer.kill()
    line = outcome(agent, root / "out")
    assert "refused workdir" in line and "who is alive" in line
    assert (root / "out" / "in" / "data").exists() and (root / "out" / MARKER).exists()
    inner.kill()
    # The next reconcile (at start, or `exitwatch reap`) takes both: the inner owner is dead.
    done = subprocess.run(
        [
            *EXITWATCH,
            "reap",
            "--config",
            quiet_config(tmp_path),
            "--workdir-root",
            str(root),
            "--docker-host",
            engine.host,
            "--audit-log",
            str(tmp_path / "audit.jsonl"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert not (root / "out").exists()


_ESCAPES = "x\x1b]0;OWNED\x07\x1b[2J\x9b31m"


def test_status_shows_escape_sequences_in_workdir_names_escaped(agent, root, attacker):
    owner = AttackerOwner(
        attacker, root, f'mkdir "$1" && printf %s "$body" > "$1/{MARKER}"', _ESCAPES
    )
    agent.wait_holding(owner.proc.pid, workdirs=1)
    shown = subprocess.run(
        [*agent.argv[:3], "status", "--status-socket", agent.flag("--status-socket")],
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout
    assert repr(_ESCAPES)[1:-1] in shown
    assert not {"\x1b", "\x07", "\x9b"} & set(shown)
    owner.kill()


def test_status_shows_escape_sequences_in_pending_orphans_escaped(root, attacker, engine, tmp_path):
    owner = AttackerOwner(
        attacker, root, f'mkdir "$1" && printf %s "$body" > "$1/{MARKER}"', _ESCAPES
    )
    owner.kill()
    config = tmp_path / "config.toml"
    config.write_text(f'{NO_LEFTOVERS}workdir_roots = ["{root}"]\ndocker_host = "{engine.host}"\n')
    done = subprocess.run(
        [*EXITWATCH, "status", "--config", str(config), "--status-socket", tmp_path / "none"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 3, done.stderr
    pending = done.stdout.split("orphans pending: 1", 1)[1]
    assert repr(_ESCAPES)[1:-1] in pending
    assert not {"\x1b", "\x07", "\x9b"} & set(done.stdout)


_CHAIN = (
    "import os, sys\n"
    "os.chdir(sys.argv[1])\n"
    "for _ in range(int(sys.argv[2])):\n"
    "    os.mkdir('d' * 255)\n"
    "    os.chdir('d' * 255)\n"
)
DEPTH = 4000
PEAK_RSS_LIMIT_KB = 100 * 1024


def _peak_rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))


def test_a_deep_tree_of_long_names_is_removed_in_bounded_memory(agent, root, attacker):
    # A path through it is a megabyte long: a string per level would cost gigabytes.
    owner = AttackerOwner(
        attacker,
        root,
        f'mkdir deep && {SYSTEM_PYTHON} -I -S -c "$1" deep {DEPTH}'
        f' && printf %s "$body" > deep/{MARKER}',
        _CHAIN,
    )
    agent.wait_holding(owner.proc.pid, workdirs=1)
    owner.kill()
    assert "reaped workdir" in outcome(agent, root / "deep")
    assert not (root / "deep").exists()
    peak = _peak_rss_kb(agent.pid)
    assert peak < PEAK_RSS_LIMIT_KB, f"the agent's peak RSS was {peak} KiB"


def test_status_since_as_a_user_who_may_not_read_the_audit_log_is_one_line(root, attacker, engine):
    private = Path(tempfile.mkdtemp(prefix="exitwatch-audit-"))  # 0700, root's
    try:
        (private / "audit.jsonl").write_text("")
        config = root / "config.toml"
        config.write_text(
            f'{NO_LEFTOVERS}workdir_roots = ["{root}"]\ndocker_host = "{engine.host}"\n'
            f'audit_log = "{private}/audit.jsonl"\n'
        )
        os.chmod(config, 0o644)
        script = (
            f'PYTHONPATH="$1" exec {SYSTEM_PYTHON} -m exitwatch status'
            ' --since 1h --config "$2" --status-socket "$3"'
        )
        args = (str(Path(__file__).resolve().parents[2]), str(config), str(root / "none"))
        proc = as_user(attacker, script, *args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        _, err = proc.communicate(timeout=60)
    finally:
        shutil.rmtree(private)
    assert proc.returncode == 1, err
    assert err.decode().splitlines() == [
        f"Error: cannot read the audit log {private}/audit.jsonl: Permission denied (it is "
        "root's: run exitwatch status as root)"
    ]
