"""A real agent process for end-to-end tests, and the container helpers they share."""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import docker.errors

from exitwatch import owner_labels
from exitwatch.service.status.server import query

from support.procs import wait_for

# The process kind is host-wide: it would count, and kill, the leftovers of every dead run
# on the host, other sessions' tests' and a bench host's real runs included. An agent, a
# scan or `exitwatch reap` of a test has it only if the test is about leftovers (and then
# compares against the runs it made); a test's own config file starts with this.
# The engines found on the host are other tests' (rootless ones of their users): only a
# test about finding them has it on.
NO_LEFTOVERS = "kill_leftovers = false\nfind_engines = false\n"


def quiet_config(directory: Path | str) -> str:
    """A config file in `directory` with the process kind off (and nothing of the host's
    /etc/exitwatch/config.toml): for `--config` of a test's scan or `exitwatch reap`."""
    path = Path(directory) / "no-leftovers.toml"
    path.write_text(NO_LEFTOVERS)
    return str(path)


def agent_argv(
    source: str,
    docker_host: str | None,
    *roots: Path,
    extra: tuple[str, ...] = (),
    leftovers: bool = False,
) -> list[str]:
    """The command line of an agent following `source`, with a short poll interval, and
    its status socket, audit log and spools (hooks, leases, watchdogs) in a fresh
    directory of its own (never the system's). Without `leftovers`, the process kind is
    off, unless `extra` names a config file (which then says, with NO_LEFTOVERS). A
    `docker_host` of None gives no --docker-host: the agent follows the engines it finds
    (and DOCKER_HOST's, or the default socket's)."""
    state = tempfile.mkdtemp(prefix="exitwatch-agent-")  # short: a socket path
    atexit.register(shutil.rmtree, state, True)
    if not leftovers and "--config" not in extra:
        extra = ("--config", quiet_config(state), *extra)
    argv = [
        sys.executable,
        "-m",
        "exitwatch",
        "agent",
        "--source",
        source,
        *(["--docker-host", docker_host] if docker_host is not None else []),
        "--poll-interval",
        "0.2",
        "--status-socket",
        f"{state}/status.sock",
        "--audit-log",
        f"{state}/audit.jsonl",
    ]
    for root in roots:
        argv += ["--workdir-root", str(root)]
    for spool in ("hook", "lease", "watchdog"):
        if f"--{spool}-dir" not in extra:
            argv += [f"--{spool}-dir", f"{state}/{spool}s"]
    # The engines it would find are the host's (other tests' rootless ones): only a test
    # about finding them asks for it.
    if "--find-engines" not in extra:
        argv.append("--no-find-engines")
    return [*argv, *extra]


class Agent:
    def __init__(self, argv: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.argv = argv
        self.log = log
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log.open("wb"),
            env=None if env is None else os.environ | env,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def flag(self, name: str) -> str:
        """The value this agent was given for option `name`."""
        return self.argv[self.argv.index(name) + 1]

    def wait_holding(self, pid: int, containers: int = 0, workdirs: int = 0) -> None:
        """Wait until the agent's index holds this many resources of the owner `pid`."""

        def held() -> bool:
            mine = [o for o in self.status()["owners"] if o["pid"] == pid]
            return bool(mine) and (len(mine[0]["containers"]), len(mine[0]["workdirs"])) == (
                containers,
                workdirs,
            )

        wait_for(held, timeout=30, what=f"the agent to hold owner {pid}'s resources")

    def status(self) -> dict:
        """This agent's status document, as `exitwatch status --json` prints it. Read here,
        with the CLI's own query: a run of the CLI costs 0.2 s of CPU, and the waits poll
        this (tests/support/cli.py runs the command itself, for the tests of it)."""
        doc = query(self.flag("--status-socket"), timeout=30)
        if doc is None:
            raise AssertionError(
                f"agent {self.pid} did not answer on its status socket:\n{self.text()}"
            )
        return doc

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_log(self, needle: str, what: str | None = None, count: int = 1) -> None:
        """Wait until `needle` appears `count` times in the log; fail if the agent exits."""

        def seen() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"agent exited {self.proc.returncode}:\n{self.text()}")
            return self.text().count(needle) >= count

        wait_for(seen, timeout=30, what=what or f"agent log line {needle!r}")

    def kill(self) -> None:
        """SIGKILL: no cleanup of any kind runs."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Agents:
    """The agents one test starts against `docker_host` with workdirs under `root`, each
    logging to a file of its own in `logs`; stop() ends them all (a fixture's teardown)."""

    def __init__(self, docker_host: str | None, root: Path, logs: Path) -> None:
        self.docker_host, self.root, self.logs = docker_host, root, logs
        self.started: list[Agent] = []

    def start(
        self,
        *extra: str,
        source: str = "netlink",
        root: Path | None = None,
        argv: list[str] | None = None,
        env: dict[str, str] | None = None,
        ready: bool = True,
    ) -> Agent:
        """An agent with `extra` arguments (or the whole `argv`), ready unless not `ready`."""
        argv = argv or agent_argv(source, self.docker_host, root or self.root, extra=extra)
        agent = Agent(argv, self.logs / f"agent-{len(self.started)}.log", env=env)
        self.started.append(agent)
        if ready:
            agent.wait_log("ready:")
        return agent

    def stop(self) -> None:
        for agent in self.started:
            agent.stop()


@contextlib.contextmanager
def running(
    engine, root: Path, log: Path, source: str = "netlink", leftovers: bool = False
) -> Iterator[Agent]:
    """An agent following `source` for workdirs under `root`, ready, stopped afterwards;
    with the process kind only if `leftovers`."""
    agent = Agent(agent_argv(source, engine.host, root, leftovers=leftovers), log)
    try:
        agent.wait_log("ready:")
        yield agent
    finally:
        agent.stop()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now, for an agent's --metrics-addr."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int, timeout: float = 5.0) -> str:
    """The text an agent's metrics endpoint on 127.0.0.1:`port` serves now."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as r:
        return r.read().decode()


def container(engine, pid=None, labels=None) -> str:
    """A running `sleep infinity` container owned by `pid`; its id.

    The agent may remove it as soon as it is created (its owner may be dead already), so
    a start that finds it gone is not an error.
    """
    labels = owner_labels(pid) if labels is None else labels
    cid = engine.client.api.create_container(engine.image, "sleep infinity", labels=labels)["Id"]
    with contextlib.suppress(docker.errors.APIError):  # 404, or 409 "removal in progress"
        engine.client.api.start(cid)
    return cid


def exists(engine, cid: str) -> bool:
    try:
        engine.client.api.inspect_container(cid)
    except docker.errors.NotFound:
        return False
    return True


# A deadline for a correct agent on a loaded 2-core machine, not a measure of its speed.
GONE_DEADLINE = 30.0


def wait_gone(engine, cids=(), paths=()) -> None:
    wait_for(
        lambda: not any(exists(engine, c) for c in cids),
        timeout=GONE_DEADLINE,
        what=f"containers {cids} gone",
    )
    wait_for(
        lambda: not any(p.exists() for p in paths),
        timeout=GONE_DEADLINE,
        what=f"workdirs {paths} gone",
    )
