"""shutdown.on_signals: a signal's action runs on a thread of its own, with nothing of the
main thread's held, however the main thread is caught by the signal."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# The main thread holds an Event's own lock, as inside its clear() or wait(), blocked in a
# read when SIGTERM comes: a Python handler would run there, inside the read, and its set()
# would wait on that lock for good.
HELD = r"""
import os, signal, threading
from exitwatch import shutdown
stopped = threading.Event()
def stop():
    os.write(1, b"called\n")
    stopped.set()
shutdown.on_signals({signal.SIGTERM: stop})
with stopped._cond:
    os.write(1, b"ready\n")
    os.read(0, 1)
if stopped.wait(30):
    os.write(1, b"stopped\n")
"""


def _lines(proc: subprocess.Popen, want: int, timeout: float = 30.0) -> list[str]:
    """The next `want` lines of `proc`'s stdout, each read under the deadline."""
    assert proc.stdout is not None
    got = []
    for _ in range(want):
        ready = select.select([proc.stdout], [], [], timeout)[0]
        assert ready, f"no line within {timeout:g} s after {got}"
        got.append(proc.stdout.readline().decode().strip())
    return got


def test_an_action_runs_while_the_main_thread_holds_what_it_needs() -> None:
    env = os.environ | {"PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-c", HELD],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        bufsize=0,  # select() sees what readline() has not read
    )
    try:
        assert _lines(proc, 1) == ["ready"]
        proc.send_signal(signal.SIGTERM)
        assert _lines(proc, 1) == ["called"]
        assert proc.stdin is not None
        proc.stdin.write(b"x")  # the main thread lets go of the lock
        proc.stdin.close()
        assert _lines(proc, 1) == ["stopped"]
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
        proc.wait()


# Each signal comes in turn: a second one of another kind, or of the same, is acted on too.
SEVERAL = r"""
import os, signal, threading
from exitwatch import shutdown
said = threading.Semaphore(0)
def say(what):
    def act():
        os.write(1, (what + "\n").encode())
        said.release()
    return act
shutdown.on_signals({signal.SIGTERM: say("term"), signal.SIGHUP: say("hup")})
os.write(1, b"ready\n")
for _ in range(3):
    said.acquire(timeout=30)
"""


def test_each_signal_is_acted_on_in_turn() -> None:
    env = os.environ | {"PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-c", SEVERAL], env=env, stdout=subprocess.PIPE, bufsize=0
    )
    try:
        assert _lines(proc, 1) == ["ready"]
        for sig, said in [(signal.SIGHUP, "hup"), (signal.SIGTERM, "term"), (signal.SIGHUP, "hup")]:
            proc.send_signal(sig)
            assert _lines(proc, 1) == [said]
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
        proc.wait()
