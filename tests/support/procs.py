"""Real processes for tests: owners that live until told, zombies, reused pids, and a
process whose main thread exits before its last thread.

Every child blocks on its stdin pipe; closing the pipe (`release`) lets it exit with the
code it was given, so no test depends on timing to make a process end.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from exitwatch import procfs
from exitwatch.owner import Owner, current_boot_id, owner_of

T = TypeVar("T")

_PY = [sys.executable, "-I", "-S", "-c"]

# The main thread exits on the first byte of stdin (pthread_exit leaves the leader a
# zombie while the process lives on); the last thread then exits when stdin closes.
_MAIN_EXITS_FIRST_C = r"""
#include <pthread.h>
#include <unistd.h>

static pthread_t leader;

static void *last(void *arg) {
    char c;
    (void)arg;
    pthread_join(leader, NULL);
    while (read(0, &c, 1) > 0) {
    }
    _exit(0);
}

int main(void) {
    pthread_t t;
    char c;
    leader = pthread_self();
    if (pthread_create(&t, NULL, last, NULL) != 0)
        return 2;
    if (read(0, &c, 1) != 1)
        return 3;
    pthread_exit(NULL);
}
"""


@dataclass
class Child:
    proc: subprocess.Popen
    owner: Owner

    @property
    def pid(self) -> int:
        return self.proc.pid


def run(
    cmd: list[str],
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    check: bool = True,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """Run a command; on failure raise with its stderr, which is what one needs to see."""
    done = subprocess.run(
        cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {done.returncode}: {done.stderr.strip()}")
    return done


def wait_for(predicate: Callable[[], T], timeout: float = 10.0, what: str = "condition") -> T:
    """Poll `predicate` until it returns something truthy; return that. Fail after `timeout`.

    The pause between polls grows from 10 ms to 50 ms: a predicate is often a request to the
    engine or a process of its own, and on two cores a test polling as fast as it can for
    seconds takes the CPU from what it waits for (and from the tests beside it)."""
    deadline = time.monotonic() + timeout
    pause = 0.01
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(pause)
        pause = min(pause * 1.25, 0.05)


def _start(argv: list[str]) -> Child:
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE)
    # The start time is fixed at fork, so reading it before the child's exec is fine.
    return Child(proc, owner_of(proc.pid))


def spawn_owner(exit_code: int = 0) -> Child:
    """A live single-threaded process that exits with `exit_code` once released."""
    return _start([*_PY, f"import sys; sys.stdin.buffer.read(); sys.exit({exit_code})"])


def release(child: Child) -> None:
    """Close the child's stdin so it exits on its own."""
    if child.proc.stdin is not None and not child.proc.stdin.closed:
        child.proc.stdin.close()


def reap(child: Child) -> int:
    """Wait for the child (ending a zombie); its Popen returncode."""
    release(child)
    return child.proc.wait()


def kill(child: Child, sig: int = signal.SIGKILL, reap_it: bool = True) -> None:
    """Send `sig`; unless `reap_it` is false, wait so the child does not linger as a zombie."""
    os.kill(child.pid, sig)
    if reap_it:
        reap(child)


def killed_owner() -> Owner:
    """The owner identity of a real process that was SIGKILLed and reaped: a fresh one at
    every call (the conftest fixture `dead_owner` is one per module)."""
    child = spawn_owner()
    kill(child)
    return child.owner


def state(pid: int) -> str | None:
    """The one-letter state of `pid`, or None once it is gone."""
    try:
        return procfs.read_stat(pid).state
    except ProcessLookupError:
        return None


def spawn_zombie(exit_code: int = 0) -> Child:
    """A child that has exited but is not waited for. `reap` it when done."""
    child = spawn_owner(exit_code)
    release(child)
    wait_for(lambda: state(child.pid) == "Z", what=f"pid {child.pid} to become a zombie")
    return child


def _main_exits_first_binary() -> str:
    digest = hashlib.sha256(_MAIN_EXITS_FIRST_C.encode()).hexdigest()[:16]
    path = os.path.join(tempfile.gettempdir(), f"exitwatch-main-exits-first-{digest}")
    if not os.path.exists(path):
        src = f"{path}.{os.getpid()}.c"
        with open(src, "w") as f:
            f.write(_MAIN_EXITS_FIRST_C)
        try:
            subprocess.run(
                ["gcc", "-O1", "-pthread", "-o", f"{path}.{os.getpid()}", src], check=True
            )
        finally:
            os.unlink(src)
        os.rename(f"{path}.{os.getpid()}", path)  # atomic: parallel test runs may race here
    return path


def spawn_main_thread_exits_first() -> Child:
    """A two-thread process. `exit_main_thread` ends its main thread; `release` the rest."""
    return _start([_main_exits_first_binary()])


def exit_main_thread(child: Child) -> None:
    assert child.proc.stdin is not None
    child.proc.stdin.write(b"x")
    child.proc.stdin.flush()


def reused_pid_owner() -> Owner:
    """An owner naming a live pid (this process) with another start time: a reused pid."""
    return Owner(current_boot_id(), os.getpid(), owner_of().starttime + 1)


def fork_storm(n: int = 200) -> None:
    """Make `n` short-lived processes exit, one after another, as fast as Python forks."""
    code = (
        "import os, sys\n"
        "for _ in range(int(sys.argv[1])):\n"
        "    if os.fork() == 0:\n"
        "        os._exit(0)\n"
        "    os.wait()\n"
    )
    subprocess.run([*_PY, code, str(n)], check=True)
