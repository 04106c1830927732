"""Leases and watchdogs as the tests make them: their two spools (root's, 1733, under a
directory anyone may search, named to the runner's side by the environment), the agent that
follows them without an engine, and runners: real processes that arm, pet, lease and hang
as they are told."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from exitwatch.alive import ENV_LEASE_DIR, ENV_WATCHDOG_DIR
from exitwatch.contract import ENV_HOOK_DIR
from exitwatch.kinds.spool.entry import ensure_spool

from support.agentproc import Agent, agent_argv
from support.hooks import REPO
from support.users import SYSTEM_PYTHON, setpriv_argv


@dataclass(frozen=True)
class Spools:
    top: Path
    hooks: Path
    leases: Path
    watchdogs: Path

    @property
    def env(self) -> dict[str, str]:
        return {
            ENV_HOOK_DIR: str(self.hooks),
            ENV_LEASE_DIR: str(self.leases),
            ENV_WATCHDOG_DIR: str(self.watchdogs),
        }

    def agent_args(self) -> tuple[str, ...]:
        return (
            *("--hook-dir", str(self.hooks)),
            *("--lease-dir", str(self.leases)),
            *("--watchdog-dir", str(self.watchdogs)),
        )


def make_spools() -> Iterator[Spools]:
    top = Path(tempfile.mkdtemp(prefix="exitwatch-alive-"))
    os.chmod(top, 0o755)
    spools = Spools(top, top / "hooks", top / "leases", top / "watchdogs")
    for path in (spools.hooks, spools.leases, spools.watchdogs):
        ensure_spool(str(path))
    try:
        yield spools
    finally:
        shutil.rmtree(top, ignore_errors=True)


def engineless_agent(spools: Spools, logs: Path, *extra: str) -> Agent:
    """A real agent (netlink source) whose work is the hooks, leases and watchdogs of
    `spools` (its engine is never there), once it follows all three."""
    root = spools.top / "root"
    root.mkdir(exist_ok=True)
    argv = agent_argv(
        "netlink",
        "unix:///nonexistent/docker.sock",
        root,
        extra=(*spools.agent_args(), *extra),
    )
    agent = Agent(argv, logs / f"agent-{time.monotonic_ns()}.log")
    for noun in ("hooks", "leases", "watchdogs"):
        agent.wait_log(f"following {noun} in")
    return agent


# A runner: it takes its orders as Python on the command line (argv[1]), with `alive` (the
# exitwatch.alive module), `out` (a file it appends lines to, flushed) and `ready()` (tells
# the test, by a line "ready" in `out`) at hand. SIGTERM is written down before it ends.
_RUNNER = r"""
import os, signal, sys, threading, time
sys.path.insert(0, sys.argv[2])
from exitwatch import alive
out = open(sys.argv[3], "a", buffering=1)
def said(*words):
    out.write(" ".join(str(w) for w in words) + "\n")
def ready():
    said("ready", os.getpid())
def on_term(signo, frame):
    said("SIGTERM", time.monotonic())
    if os.environ.get("RUNNER_IGNORES_TERM"):
        return
    os._exit(143)
signal.signal(signal.SIGTERM, on_term)
exec(sys.argv[1])
"""


class Runner:
    """A real runner process, run as `user` (default: root), doing `script`."""

    def __init__(
        self,
        script: str,
        spools: Spools,
        tmp: Path,
        user: pwd.struct_passwd | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.out = tmp / f"runner-{time.monotonic_ns()}.out"
        self.out.touch()
        os.chmod(self.out, 0o666)
        python = sys.executable if user is None else SYSTEM_PYTHON
        argv = [python, "-I", "-S", "-c", _RUNNER, script, str(REPO), str(self.out)]
        if user is not None:
            argv = setpriv_argv(user, *argv)
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            env={"PATH": "/usr/bin:/bin", **spools.env, **(env or {})},
            cwd="/",
        )
        self.pid = self.proc.pid
        self.ended: float | None = None

    def lines(self) -> list[str]:
        return self.out.read_text().splitlines()

    def said(self, word: str) -> list[str]:
        return [line for line in self.lines() if line.split(" ", 1)[0] == word]

    def alive(self) -> bool:
        """Whether it still runs (reaped here once it ended, its end time kept)."""
        if self.proc.poll() is None:
            return True
        if self.ended is None:
            self.ended = time.monotonic()
        return False

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)
