"""Running one command of a spool's entry (a hook, a lease's run) as its user:
credentials, environment, directory, a process group of its own that is killed as a whole
when the command ends, times out or is stopped, the tail of its output, and an OOM score
of its own.

Nothing here knows what an entry is; the kinds decide what runs and as whom.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import select
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

TAIL_BYTES = 2048  # of the output kept for the audit record
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
USER_PATH = "/usr/local/bin:/usr/bin:/bin"
# The directory is changed by the hook's own shell, after its credentials are the user's:
# the kernel then checks every step (a symlink included) with the user's rights, so a
# recorded path can lead nowhere the user could not go. A directory that is gone or out
# of reach falls back to HOME, and that to /.
#
# The agent runs with OOMScoreAdjust=-500, which a child inherits: the shell puts the hook
# back to 0 first (raising it needs no privilege; exec made /proc/self the user's again).
_ENTER = (
    "echo 0 > /proc/self/oom_score_adj 2>/dev/null; "
    'cd -P -- "$1" 2>/dev/null || cd -P -- "$2" 2>/dev/null || cd /; shift 2; exec "$@"'
)


@dataclass(frozen=True)
class Ran:
    """How one run of a command ended."""

    returncode: int  # negative: killed by that signal
    timed_out: bool
    seconds: float
    tail: str  # the last TAIL_BYTES of stdout and stderr together
    stopped: bool = False  # killed because one of its stop descriptors became readable

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and not self.stopped

    def describe(self) -> str:
        if self.stopped:
            how = "stopped, process group killed"
        elif self.timed_out:
            how = "timed out, process group killed"
        elif self.returncode < 0:
            how = f"killed by {_signame(-self.returncode)}"
        else:
            how = f"exited with code {self.returncode}"
        return f"{how} after {self.seconds:.2f} s"


def environment(user: pwd.struct_passwd, recorded: Mapping[str, str]) -> dict[str, str]:
    """A minimal login-like environment, then what the hook recorded."""
    env = {
        "PATH": SYSTEM_PATH if user.pw_uid == 0 else USER_PATH,
        "HOME": user.pw_dir,
        "USER": user.pw_name,
        "LANG": "C.UTF-8",
    }
    env.update(recorded)
    return env


def run_as(
    user: pwd.struct_passwd,
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: str,
    timeout: float,
    stop_fds: Iterable[int] = (),
) -> Ran:
    """Run `argv` as `user` (uid, primary gid, supplementary groups) with exactly `env`,
    in `cwd` as the user may reach it, stdin from /dev/null, in a new session whose
    process group is killed once its leader has exited (or at the timeout, or as soon as
    one of `stop_fds` is readable: a lease's owner's pidfd, the agent's stop). Raises
    OSError when it cannot be started, or its group cannot be killed."""
    groups = os.getgrouplist(user.pw_name, user.pw_gid)
    started = time.monotonic()
    proc = subprocess.Popen(
        ["/bin/sh", "-c", _ENTER, "exitwatch-hook", cwd or user.pw_dir, user.pw_dir, *argv],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=dict(env),
        cwd="/",
        user=user.pw_uid,
        group=user.pw_gid,
        extra_groups=groups,
        start_new_session=True,  # its own group, for the timeout to kill as a whole
        umask=0o022,
    )
    assert proc.stdout is not None
    out = proc.stdout.fileno()
    pidfd = -1
    tail = bytearray()
    timed_out = stopped = False
    stops = set(stop_fds)
    try:
        pidfd = os.pidfd_open(proc.pid)  # readable once it has exited: no polling loop
        poller = select.poll()
        poller.register(out, select.POLLIN)
        poller.register(pidfd, select.POLLIN)
        for fd in stops:
            poller.register(fd, select.POLLIN)
        deadline = started + timeout
        exited = False
        while not exited:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                _kill_group(proc.pid)
                break
            ready = {fd for fd, _ in poller.poll(left * 1000)}
            if out in ready and not _read_into(out, tail):
                poller.unregister(out)
            # One that ended by itself meanwhile was not stopped.
            exited = pidfd in ready
            if not exited and ready & stops:
                stopped = exited = True
        # Whatever it left running goes with it, a success too: killed while the leader is
        # an unreaped zombie, which keeps its pid (the group's id) from being reused.
        # A child that called setsid has left the group, and is out of reach here.
        _kill_group(proc.pid)
        proc.wait()
        # What it wrote before it ended.
        os.set_blocking(out, False)
        with contextlib.suppress(BlockingIOError):
            while _read_into(out, tail):
                pass
    finally:
        if pidfd >= 0:
            os.close(pidfd)
        proc.stdout.close()
        if proc.returncode is None:  # interrupted above: leave no hook running unwatched
            with contextlib.suppress(OSError):
                _kill_group(proc.pid)
                proc.wait()
    seconds = time.monotonic() - started
    text = bytes(tail).decode("utf-8", "replace")
    return Ran(proc.returncode, timed_out, seconds, text, stopped and not timed_out)


def _kill_group(pgid: int) -> None:
    """SIGKILL the process group; OSError (EPERM without CAP_KILL) when it cannot be."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    except OSError as err:
        raise OSError(err.errno, f"cannot kill its process group: {err.strerror}") from None


def _read_into(fd: int, tail: bytearray) -> bool:
    """Read once from `fd` into the bounded `tail`; False at end of file."""
    chunk = os.read(fd, 65536)
    tail += chunk
    del tail[:-TAIL_BYTES]
    return bool(chunk)


def _signame(signo: int) -> str:
    try:
        return signal.Signals(signo).name
    except ValueError:
        return f"signal {signo}"
