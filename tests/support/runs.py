"""Fake runs for the process kind's tests: a real process standing for `exitwatch run`'s
wrapper (the owner), whose child calls setsid, carries the owner and survives the owner's
SIGKILL, as a runner's background process does. The `runs` fixture (tests/conftest.py)
closes those a test made."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from exitwatch import procfs
from exitwatch.contract import ENV_OWNER, ENV_RUN
from exitwatch.owner import Owner, owner_of

from support.users import as_user, setpriv_argv

# The wrapper: reads its owner string, starts a leftover in a session of its own that
# tells its pid, then stays (exec keeps the pid and start time, so the owner stays valid).
WRAPPER = (
    'read owner; EXITWATCH_OWNER="$owner" EXITWATCH_RUN="$owner" '
    "setsid sh -c 'echo $$; exec sleep 1000000' </dev/null 2>/dev/null & exec sleep 1000000"
)


class Proc:
    """One process, pinned by (pid, start time)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.starttime = procfs.read_stat(pid).starttime

    def ended(self) -> bool:
        try:
            stat = procfs.read_stat(self.pid)
        except ProcessLookupError:
            return True
        return stat.starttime != self.starttime or stat.state in ("Z", "X")

    def kill(self) -> None:
        if not self.ended():
            os.kill(self.pid, signal.SIGKILL)


class FakeRun:
    """A live run of `user` (root when None) with one leftover-to-be."""

    def __init__(self, user=None, script: str = WRAPPER) -> None:
        pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE}
        if user is None:
            self.proc = subprocess.Popen(["/bin/sh", "-c", script], **pipes)
        else:
            self.proc = as_user(user, script, **pipes)
        self.owner: Owner = owner_of(self.proc.pid)
        self.proc.stdin.write(f"{self.owner}\n".encode())
        self.proc.stdin.close()
        self.leftover = Proc(int(self.proc.stdout.readline()))
        self.proc.stdout.close()
        self.others: list[subprocess.Popen] = []

    def carrier(self, user=None) -> Proc:
        """Another process carrying this run's owner, not a descendant of it: started by
        `user` who set the variable by hand, or by root (as through `sudo -E`)."""
        env = os.environ | {ENV_OWNER: str(self.owner), ENV_RUN: str(self.owner)}
        argv = ["sleep", "1000000"]
        proc = subprocess.Popen(argv if user is None else setpriv_argv(user, *argv), env=env)
        self.others.append(proc)
        return Proc(proc.pid)

    def kill(self) -> None:
        """SIGKILL the wrapper: the leftover lives on, reparented."""
        self.proc.kill()
        self.proc.wait()

    def close(self) -> None:
        self.kill()
        self.leftover.kill()
        for proc in self.others:
            proc.kill()
            proc.wait()


# Tries of a case that another agent on the host may spoil by killing its processes first
# (a coin toss each, at worst).
CONTESTED_TRIES = 8


def other_agents(but: int | None = None) -> list[str]:
    """The exitwatch agents and reaps on the host other than process `but`. The process kind
    is host-wide: each of them with it kills a dead run's leftovers too, and may get there
    first (never a live leftover judged gone)."""
    others = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [w.decode(errors="replace") for w in argv]
        if int(pid) != but and exitwatch_command(words) in ("agent", "reap"):
            others.append(f"{pid}: {' '.join(words)[:200]}")
    return others


def exitwatch_command(argv: list[str]) -> str | None:
    """The exitwatch command ("agent", "reap", "run", ...) that a process with these
    arguments runs, however it was started: the console script by any path
    (/usr/bin/exitwatch, a venv's, ./exitwatch), its interpreter before it, or `python -m
    exitwatch`; None for any other program. The command is the first word after the
    program that is not an option (options before it, such as --config, take a value)."""
    if not argv or not os.path.basename(argv[0]).startswith(("python", "exitwatch")):
        return None
    for i, word in enumerate(argv):
        if word == "-m" and i + 1 < len(argv) and argv[i + 1] in ("exitwatch", "exitwatch.cli"):
            rest = argv[i + 2 :]
            break
        if os.path.basename(word) == "exitwatch":
            rest = argv[i + 1 :]
            break
        if i > 0 and not word.startswith("-"):
            return None  # an interpreter's script that is not exitwatch's
    else:
        return None
    words = iter(rest)
    for word in words:
        if word.startswith("--") and "=" not in word:
            next(words, None)  # the option's value
        elif not word.startswith("-"):
            return word
    return None
