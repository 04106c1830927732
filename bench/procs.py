"""The processes a benchmark runs and measures: the agent, owners, and /proc CPU and RSS."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from exitwatch.contract import mark_workdir
from exitwatch.owner import Owner, owner_of
from exitwatch.service.status.server import query

TICKS = os.sysconf("SC_CLK_TCK")
READY = "ready: watching "

# The agent's netlink source asks for the kernel's exit-only filter wherever the kernel
# has it, and has no switch to turn it off. The storm's "without the filter" run gets the
# agent as it would run on a kernel older than 6.6, by the one decision that changes; its
# reason line says so, rather than blame this kernel's version.
NO_FILTER_FEATURE = (
    "all proc events, filtered in user space: the benchmark turned the exit-only filter off"
)
_NO_FILTER = f"""
import dataclasses
import exitwatch.sources as s
import exitwatch.sources.netlink as n
n.exit_filter_supported = lambda release=None: False
s.CANDIDATES = tuple(
    dataclasses.replace(c, feature=lambda: {NO_FILTER_FEATURE!r}) if c.name == "netlink" else c
    for c in s.CANDIDATES
)
from exitwatch.cli import main
main()
"""


class AgentFailed(RuntimeError):
    """The agent exited, or did not get ready in time; the message ends with its last words."""


def cpu_seconds(pid: int | str) -> float:
    """utime + stime of the whole process (all its threads), in seconds; or of one thread,
    given as "PID/task/TID"."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def thread_of(pid: int, comm: str) -> str | None:
    """ "PID/task/TID" of the thread of `pid` the kernel knows as `comm`, if there is one."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/comm") as f:
            if f.read().strip() == comm:
                return f"{pid}/task/{tid}"
    return None


def rss_mb(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) in MB: resident now, and the peak."""
    values = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                values[key] = int(rest.split()[0]) / 1024
    return round(values["VmRSS"], 1), round(values["VmHWM"], 1)


class CpuMeter:
    """CPU seconds a process used between `begin` and `end`. Sampled in the background too,
    so a process that dies early still has its last reading."""

    def __init__(self, pid: int | str) -> None:
        self.pid = pid
        self.exited_early = False
        self._first = cpu_seconds(pid)
        self._last = self._first
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def begin(self) -> None:
        self._first = self._last = cpu_seconds(self.pid)
        self._thread.start()

    def _read(self) -> None:
        try:
            self._last = cpu_seconds(self.pid)
        except (FileNotFoundError, ProcessLookupError, IndexError):
            self.exited_early = True

    def _sample(self) -> None:
        while not self._stop.wait(0.2):
            self._read()

    def end(self) -> float:
        self._stop.set()
        self._thread.join()
        self._read()
        return self._last - self._first


@dataclass
class Agent:
    """`exitwatch agent` as a separate process, its stderr followed line by line."""

    source: str
    docker_host: str
    roots: list[str]
    poll_interval: float | None = None
    exit_filter: bool = True
    hook_dir: str | None = None  # None: a spool of its own, empty
    watchdog_dir: str | None = None  # the same, of watchdogs
    lease_dir: str | None = None  # the same, of leases
    reconcile_interval: float | None = None
    engine_concurrency: int | None = None  # None: the default
    engines: tuple[str, ...] = ()  # several engines: --engine each, in place of docker_host
    find_engines: bool | None = None  # None: as deployed (the config's default)
    lines: list[str] = field(default_factory=list)
    arrived: list[float] = field(default_factory=list)  # monotonic, one per line
    started: float = 0.0
    ready_at: float | None = None

    def __post_init__(self) -> None:
        self._ready = threading.Event()
        self._state = ""
        self.proc: subprocess.Popen[str] | None = None

    def argv(self) -> list[str]:
        head = [sys.executable, "-m", "exitwatch"]
        if not self.exit_filter:
            head = [
                sys.executable,
                "-c",
                f"NO_FILTER_FEATURE = {NO_FILTER_FEATURE!r}\n{_NO_FILTER}",
            ]
        argv = [*head, "agent", "--source", self.source]
        if self.engines:
            argv += [x for url in self.engines for x in ("--engine", url)]
        else:
            argv += ["--docker-host", self.docker_host]
        if self.find_engines is not None:
            argv.append("--find-engines" if self.find_engines else "--no-find-engines")
        for root in self.roots:
            argv += ["--workdir-root", root]
        if self.poll_interval is not None:
            argv += ["--poll-interval", str(self.poll_interval)]
        if self.reconcile_interval is not None:
            argv += ["--reconcile-interval", str(self.reconcile_interval)]
        # Its own status socket and audit log: another agent on this host (a test's, the
        # host's own) holds the default socket, and the host's audit log is not ours.
        argv += ["--status-socket", os.path.join(self._state, "status.sock")]
        argv += ["--audit-log", os.path.join(self._state, "audit.jsonl")]
        argv += ["--hook-dir", self.hook_dir or os.path.join(self._state, "hooks")]
        argv += ["--watchdog-dir", self.watchdog_dir or os.path.join(self._state, "watchdogs")]
        argv += ["--lease-dir", self.lease_dir or os.path.join(self._state, "leases")]
        if self.engine_concurrency is not None:  # a setting with no option of its own
            config = os.path.join(self._state, "config.toml")
            with open(config, "w") as f:
                f.write(f"[containers]\nconcurrency = {self.engine_concurrency}\n")
            argv += ["--config", config]
        return argv

    def start(self) -> Agent:
        self._state = tempfile.mkdtemp(prefix="exitwatch-bench-agent-")
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            self.argv(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        threading.Thread(target=self._follow, daemon=True).start()
        return self

    def _follow(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for line in self.proc.stderr:
            if self.ready_at is None and READY in line:
                self.ready_at = time.monotonic()
                self._ready.set()
            self.arrived.append(time.monotonic())
            self.lines.append(line.rstrip("\n"))
        self._ready.set()  # it exited: wake whoever waits for it to get ready

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def wait_ready(self, timeout: float = 300.0) -> float:
        """Seconds from start to its "ready:" line."""
        self._ready.wait(timeout)
        if self.ready_at is None:
            self.stop()
            said = [x for x in self.lines if " WARNING " in x or " ERROR " in x] or self.lines
            tail = " | ".join(said[-3:]) or "no output"
            raise AgentFailed(f"agent --source {self.source} did not get ready: {tail}")
        return self.ready_at - self.started

    def watching(self) -> int:
        """The N of its "ready: watching N owners" line."""
        line = next(x for x in self.lines if READY in x)
        return int(line.split(READY, 1)[1].split()[0])

    def status(self) -> dict:
        """The agent's status document, from its status socket."""
        doc = query(os.path.join(self._state, "status.sock"), timeout=30)
        if doc is None:
            raise AgentFailed(f"agent --source {self.source} does not answer on its status socket")
        return doc

    def counters(self) -> dict[str, int]:
        """The agent's own counters (events_lost, resyncs, ...)."""
        return self.status()["counters"]

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self._state, ignore_errors=True)

    def __enter__(self) -> Agent:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class Runner:
    """An owner: a `sleep` process that lives until SIGKILLed."""

    proc: subprocess.Popen[bytes]
    owner: Owner

    @classmethod
    def spawn(cls) -> Runner:
        proc = subprocess.Popen(["sleep", "infinity"], stdin=subprocess.DEVNULL)
        return cls(proc, owner_of(proc.pid))

    def kill(self) -> float:
        """SIGKILL it; the monotonic time the signal was sent."""
        at = time.monotonic()
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        return at

    def end(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def spawn_owners(n: int) -> list[Runner]:
    return [Runner.spawn() for _ in range(n)]


def marked_dirs(root: str, owners: list[Runner], prefix: str) -> list[str]:
    """A workdir under `root` for each owner, marked as the runner contract says."""
    dirs = []
    for i, o in enumerate(owners):
        path = os.path.join(root, f"{prefix}-{i}")
        os.mkdir(path)
        mark_workdir(path, o.proc.pid)
        dirs.append(path)
    return dirs


def end_owners(owners: list[Runner]) -> None:
    for o in owners:
        o.end()


def set_environ(values: dict[str, str]) -> Callable[[], None]:
    """Set `values` in this process's environment (what the runner's side of exitwatch
    reads, a spool's path); the call that puts it back as it was."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)

    def restore() -> None:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

    return restore
