"""`exitwatch run`: run a command as one owner, and remove what it leaves when it ends.

The wrapper is the owner. CMD is its child, killed with it (parent-death signal); its Docker
client is pointed at the run's socket (proxy/server.py), which labels what it creates, and its
TMPDIR at a marked directory (dirs.py says where both go, and why there). A CONTAINER_HOST
(podman's remote CLI) gets a socket of the run's too, in front of the podman service it
names: the same socket when that is DOCKER_HOST's engine, else a second proxy. When CMD ends,
whatever the cause, the wrapper ends CMD's leftover descendants (it is their subreaper),
removes the run's containers, networks, volumes and directories with the agent's own
removal code, and exits with CMD's status. Were the wrapper killed instead, the agent finds
all of it by the same label and markers.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from exitwatch import alive, procfs
from exitwatch.contract import ENV_OWNER, ENV_RUN
from exitwatch.engine import url
from exitwatch.kinds.base import Outcome
from exitwatch.owner import Owner, OwnerError, owner_of
from exitwatch.proxy import limits
from exitwatch.proxy.policy import Always
from exitwatch.proxy.server import Proxy, ProxyError, listen
from exitwatch.run import dirs
from exitwatch.run.timeouts import Timeouts, relay

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
SI_KERNEL = 0x80  # si_code of a signal the kernel sent: the tty's Ctrl-C, Ctrl-\, hangup
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
ESCALATE = (signal.SIGINT, signal.SIGTERM)  # a second one of these kills CMD
WAITED = {*FORWARDED, signal.SIGCHLD}
KILL_WAIT = 5.0  # seconds to wait for leftovers to die of SIGKILL before saying so
SETUP_FAILED = 125  # the wrapper could not run CMD at all, as timeout(1) and env(1) say
ENDED = "the run ended"  # how the owner "died", for the removal code it reuses
SOCKETS = ("docker.sock", "podman.sock")  # the run's sockets: DOCKER_HOST's, CONTAINER_HOST's
STAYS = (
    "the run's containers, networks and volumes there stay, and the agent reaps them by "
    "their label once it answers again"
)

_libc = ctypes.CDLL(None, use_errno=True)


class RunError(Exception):
    """The run cannot start; the message is one line."""


@dataclass(frozen=True)
class Settings:
    grace: float = 5.0  # seconds between SIGTERM and SIGKILL for leftover descendants
    tmpdir: bool = True  # give CMD a fresh, marked TMPDIR
    max_time: float | None = None  # the agent's watchdog ends the run after this long
    idle_timeout: float | None = None  # ... or once CMD wrote nothing for this long


def _prctl(option: int, arg: int) -> None:
    if _libc.prctl(option, arg, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _say(text: str) -> None:
    print(f"exitwatch run: {text}", file=sys.stderr, flush=True)


def run(argv: Sequence[str], settings: Settings, env: Mapping[str, str] = os.environ) -> int:
    """Run `argv` as the run's command; its exit status (128+N for signal N), or 127/126
    when it cannot be executed. Raises RunError, before running anything, when the run
    cannot be set up."""
    try:
        owner = owner_of()
        engine = url.chosen(env=env)  # the engine CMD's client would have used
    except url.EndpointError as err:
        raise RunError(f"{url.ENV}: {err}") from None
    except OwnerError as err:
        raise RunError(str(err)) from None
    try:
        podman = url.podman(env)  # the podman service CMD's podman CLI would have used
    except url.EndpointError as err:
        raise RunError(f"{url.PODMAN_ENV}: {err}") from None
    # A second engine only when it is another socket: one proxy serves both APIs.
    engines = [engine] + ([podman] if podman and podman.where != engine.where else [])
    try:
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
        bases = dirs.pick(env, settings.tmpdir)
    except (OSError, dirs.NoPlace) as err:
        raise RunError(str(err)) from None
    for note in bases.notes:
        _say(note)
    # Signals are taken with sigwaitinfo, which says who sent each. Blocked from here on, a
    # signal that comes during set-up waits for CMD; every thread inherits the mask.
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, WAITED)
    made: list[dirs.Made] = []
    proxies: list[Proxy] = []
    base = bases.socket
    try:
        try:
            made.append(dirs.make(base, owner))
            # Bound through the directory's descriptor, the socket lands in it whatever the
            # path names by then; clients connect by the path, which nobody else can change.
            listeners = [
                listen(made[0].path, dir_fd=made[0].fd, name=name)
                for name in SOCKETS[: len(engines)]
            ]
            child_env = dict(env)
            child_env[url.ENV] = url.served(f"{made[0].path}/{SOCKETS[0]}")
            if podman is not None:
                socket = SOCKETS[len(engines) - 1]  # docker.sock when it is the same engine
                child_env[url.PODMAN_ENV] = url.served(f"{made[0].path}/{socket}")
            child_env[ENV_OWNER] = child_env[ENV_RUN] = str(owner)
            if bases.tmpdir is not None:
                base = bases.tmpdir
                made.append(dirs.make(base, owner))
                child_env["TMPDIR"] = made[1].path
        except ProxyError as err:
            raise RunError(str(err)) from None
        except OSError as err:
            raise RunError(
                f"cannot make the run's directory in {base.path}: {err.strerror}"
            ) from None
        finally:
            bases.close()
        bounds = _shared(limits.of_process(shared=False), len(listeners))
        for listener, where in zip(listeners, engines, strict=True):
            proxies.append(Proxy(listener, where, Always(str(owner)), bounds))
        status = _supervise(argv, child_env, proxies, settings, old_mask)
        for proxy in proxies:
            proxy.stop()
    finally:
        reached = [p.reached for p in proxies] or [False] * len(engines)
        for where, was_reached in zip(engines, reached, strict=True):
            _cleanup(owner, where, was_reached)
        _remove_dirs(owner, made)
    return status


def _shared(bounds: limits.Limits, proxies: int) -> limits.Limits:
    """`bounds` shared out between the run's `proxies`, which draw on one process's limits."""
    if proxies == 1:
        return bounds
    total = max(1, bounds.total // proxies)
    return limits.Limits(total, total, f"{bounds.why}, shared by {proxies} sockets")


def _supervise(
    argv: Sequence[str],
    env: Mapping[str, str],
    proxies: list[Proxy],
    settings: Settings,
    old_mask: set[signal.Signals],
) -> int:
    me = os.getpid()

    def child() -> None:
        # The parent-death signal follows the thread that forked: this main thread lives as
        # long as the wrapper does.
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != me:  # the wrapper died before the signal was armed
            os.kill(os.getpid(), signal.SIGKILL)
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)

    timeouts = _timeouts(settings)
    pipes = [os.pipe2(os.O_CLOEXEC) for _ in range(2)] if settings.idle_timeout else []
    try:
        # Forked before the proxy's threads exist: the child runs Python code until exec.
        outputs = {"stdout": pipes[0][1], "stderr": pipes[1][1]} if pipes else {}
        proc = subprocess.Popen(list(argv), env=dict(env), preexec_fn=child, **outputs)
    except OSError as err:
        _say(f"{argv[0]}: {err.strerror}")
        if timeouts is not None:
            timeouts.cancel()
        return 127 if isinstance(err, FileNotFoundError) else 126
    finally:
        for _, write_end in pipes:
            os.close(write_end)
    relays = []
    if pipes and timeouts is not None:
        relays = [relay(pipes[0][0], 1, timeouts), relay(pipes[1][0], 2, timeouts)]
    for proxy in proxies:
        proxy.start()
    status = _wait(proc, timeouts)
    if timeouts is not None:
        timeouts.cancel()
    _end_descendants(settings.grace)
    for thread in relays:  # what CMD and its own wrote last; a writer that escaped is left
        thread.join(1.0)
    return status


def _timeouts(settings: Settings) -> Timeouts | None:
    """The run's watchdog, armed with the agent, for --max-time and --idle-timeout; None
    without them. Raises RunError when it cannot be armed (no agent's spool)."""
    if settings.max_time is None and settings.idle_timeout is None:
        return None
    try:
        return Timeouts(settings.max_time, settings.idle_timeout, settings.grace)
    except (OSError, ValueError) as err:
        why = getattr(err, "strerror", None) or err
        raise RunError(
            f"--max-time and --idle-timeout need the exitwatch agent's watchdog, which "
            f"cannot be armed: {why} (is the agent running? its spool: "
            f"{alive.watchdog_dir()})"
        ) from None


def _wait(proc: subprocess.Popen, timeouts: Timeouts | None = None) -> int:
    """Forward signals to CMD until it exits; its status, as a shell reports it."""
    escalate = 0
    while True:
        info = signal.sigwaitinfo(WAITED)
        if info.si_signo == signal.SIGCHLD:
            status = _reap(proc.pid)
            if status is not None:
                proc.returncode = status  # reaped here, not by Popen
                return status
            continue
        if info.si_code == SI_KERNEL:
            continue  # from the tty to the whole foreground group: CMD has it already
        sig = signal.Signals(info.si_signo)
        why = timeouts.overdue() if timeouts and sig == signal.SIGTERM else None
        if why is not None:
            _say(why)
        if sig in ESCALATE:
            escalate += 1
        _signal(proc.pid, signal.SIGKILL if escalate > 1 else sig)


def _signal(pid: int, sig: int) -> None:
    # Exited (its SIGCHLD is on the way), or runs a setuid program of another uid.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def _reap(cmd: int) -> int | None:
    """Reap every exited child (orphans adopted by the subreaper too); CMD's status, if it
    was among them."""
    found = None
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return found
        if pid == 0:
            return found
        if pid == cmd:
            found = os.waitstatus_to_exitcode(status)
            if found < 0:
                found = 128 - found


def _descendants() -> Iterator[tuple[int, int]]:
    """(pid, start time) of every live process below this one, zombies left out."""
    me = os.getpid()
    children: dict[int, list[procfs.Stat]] = {}
    for name in os.listdir(procfs.PROC):
        if not name.isdigit():
            continue
        try:
            st = procfs.read_stat(int(name))
        except (ProcessLookupError, PermissionError):
            continue
        children.setdefault(st.ppid, []).append(st)
    todo = list(children.get(me, ()))
    while todo:
        st = todo.pop()
        todo += children.get(st.pid, ())
        if st.state not in ("Z", "X", "x"):
            yield st.pid, st.starttime


def _kill(pid: int, starttime: int, sig: int) -> None:
    """Signal the process `pid` if it is still the one that started at `starttime`."""
    try:
        fd = os.pidfd_open(pid)
    except (ProcessLookupError, PermissionError):
        return
    try:
        if procfs.read_stat(pid).starttime == starttime:
            signal.pidfd_send_signal(fd, sig)
    except (ProcessLookupError, PermissionError):  # gone, or a setuid program of another uid
        pass
    finally:
        os.close(fd)


def _end_descendants(grace: float) -> None:
    """SIGTERM every leftover descendant (those orphaned to this subreaper, setsid or not),
    SIGKILL those still there after `grace` seconds, and reap them all."""
    deadline = time.monotonic() + grace
    termed: set[tuple[int, int]] = set()
    while True:
        _reap(-1)
        left = set(_descendants())
        if not left:
            return
        now = time.monotonic()
        if now >= deadline + KILL_WAIT:
            # In uninterruptible sleep, or of another uid: say so rather than wait forever.
            shown = ", ".join(f"pid {pid}" for pid, _ in sorted(left))
            _say(f"left running after SIGKILL: {shown}")
            return
        late = now >= deadline
        for pid, start in left - (set() if late else termed):
            _kill(pid, start, signal.SIGKILL if late else signal.SIGTERM)
            if not late:
                _kill(pid, start, signal.SIGCONT)  # a stopped process acts on it now
        termed |= left
        signal.sigtimedwait({signal.SIGCHLD}, 0.05)


def _cleanup(owner: Owner, engine: url.Endpoint, reached: bool) -> None:
    """Remove what the run holds on `engine`: its pods (podman's), containers (compose
    projects whole), networks and volumes. Says what could not go; the agent retries that
    once the wrapper is gone. `reached`: whether the engine ever took a connection of the
    socket's."""
    from exitwatch.kinds.docker.attempts import EngineError
    from exitwatch.kinds.docker.kind import Containers

    outcomes: list[Outcome] = []
    docker = Containers(host=engine.url)
    try:
        try:
            outcomes += docker.remove(owner, docker.owned(owner), dry_run=False, how=ENDED)
        except EngineError as err:
            down = docker.ping()
            if down is None:
                _say(f"containers of the run left in place: {err}")
            elif reached:  # else nothing can have been made through the socket
                _say(f"{down}; {STAYS}")
    finally:
        docker.stop()
    _report(outcomes)


def _remove_dirs(owner: Owner, made: list[dirs.Made]) -> None:
    """Remove the run's directories, after what its engines hold."""
    _report([dirs.remove(m, owner) for m in made])


def _report(outcomes: list[Outcome]) -> None:
    for o in outcomes:
        if not o.ok:
            _say(f"{o.what} left in place: {o.detail}")
