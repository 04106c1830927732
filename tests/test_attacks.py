"""Attacks on workdir removal through a real agent: the attacker is an unprivileged user
(setpriv) whose own process owns a marked workdir under a world-writable root, and who dies
by SIGKILL. tests/test_workdirs.py attacks the removal code directly; here the whole agent
path is attacked: discovery, the death, the removal. The victim's checksum never changes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import test_workdirs
from test_workdirs import as_user, digest, swapping_as

from exitwatch.contract import MARKER
from exitwatch.owner import Owner, owner_of

from agentproc import Agent, running
from procs import wait_for

# The attacker and the victim tree of the workdir tests, as fixtures here too.
attacker = test_workdirs.attacker
victim = test_workdirs.victim

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
    top = tempfile.mkdtemp(prefix="exitwatch-attack-", dir="/tmp")
    os.chmod(top, 0o1777)
    try:
        yield Path(top)
    finally:
        # rmtree would descend into a bind mount and wipe the victim.
        test_workdirs._lazy_umount_below(top)
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
