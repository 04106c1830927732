"""`exitwatch adopt` at the edge of its process's limits (issue 30, defects 1 and 6): in a
pids cgroup that lets it start only a few threads, a burst of connections is answered and
the accept loop lives on, so a normal client is served after it; under a low RLIMIT_NOFILE,
one client's idle keep-alive connections are held to its share, and another client is
served while they stay open."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from support.adopt import adopting
from support.procs import wait_for

PING = b"GET /_ping HTTP/1.1\r\nHost: docker\r\n\r\n"
PIDS = Path("/sys/fs/cgroup/pids")


def _answer(path: Path, timeout: float = 15.0) -> bytes:
    """One _ping through the socket at `path`: the answer's bytes, b"" if closed unanswered."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(timeout)
        s.connect(str(path))
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            s.sendall(PING)
        data = b""
        with contextlib.suppress(ConnectionResetError):
            while not (data.endswith(b"\r\n\r\nOK") or b'"}\n' in data):
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        return data


@contextlib.contextmanager
def _pids_cgroup(most: int) -> Iterator[Path]:
    """A fresh cgroup v1 pids cgroup whose tasks are `most` at most; emptied and removed."""
    if not (PIDS / "cgroup.procs").exists():
        pytest.skip("no cgroup v1 pids hierarchy at /sys/fs/cgroup/pids")
    group = PIDS / f"exitwatch-test-{os.getpid()}-{threading.get_ident() % 10000}"
    group.mkdir()
    try:
        (group / "pids.max").write_text(f"{most}\n")
        yield group
    finally:
        for pid in (group / "cgroup.procs").read_text().split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        wait_for(lambda: not (group / "cgroup.procs").read_text().split(), what="cgroup empty")
        group.rmdir()


def _into(group: Path) -> Callable[[], None]:
    def enter() -> None:
        with open(group / "cgroup.procs", "w") as f:
            f.write(str(os.getpid()))

    return enter


def test_a_burst_past_the_task_limit_is_answered_and_the_next_client_served(
    engine, tmp_path
) -> None:
    # 16 tasks: the limits read from pids.max allow 4 connections at once; sleepers
    # moved into the cgroup then leave room for 2 threads, so starting workers fails too.
    with _pids_cgroup(16) as group, adopting(engine, logs=tmp_path, preexec=_into(group)) as adopt:
        idle = int((group / "pids.current").read_text())
        sleepers = [
            subprocess.Popen(["sleep", "1000"], preexec_fn=_into(group))
            for _ in range(16 - idle - 2)
        ]
        try:
            answers: list[bytes] = []

            def burst() -> None:
                answers.append(_answer(adopt.listen))

            threads = [threading.Thread(target=burst) for _ in range(50)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            assert len(answers) == 50
            served = [a for a in answers if a.startswith(b"HTTP/1.1 200 OK")]
            refused = [a for a in answers if a.startswith(b"HTTP/1.1 503")]
            assert served, answers[:3]
            assert refused, "the burst never met the limit"
            assert all(b"exitwatch: " in a for a in refused), refused[:3]
            assert adopt.proc.poll() is None
        finally:
            for s in sleepers:
                s.kill()
                s.wait()

        # The accept loop lives: a normal client is served. (A burst client's connection
        # may still be ending, and count against the one connection a client may hold:
        # its refusal is an answer, and the client asks again, as any would.)
        def served() -> bool:
            answer = _answer(adopt.listen)  # never hangs: answered or closed at once
            assert answer.startswith((b"HTTP/1.1 200 OK", b"HTTP/1.1 503")), answer
            return answer.startswith(b"HTTP/1.1 200 OK")

        wait_for(served, timeout=30, what="a normal client served after the burst")
        # One line for the burst, not one per refused client.
        assert adopt.text().count("connections refused") == 1, adopt.text()


HOG = r"""
import socket, sys
ping = b"GET /_ping HTTP/1.1\r\nHost: docker\r\n\r\n"
held, ok = [], 0
for _ in range(int(sys.argv[2])):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(15)
    try:
        s.connect(sys.argv[1])
        s.sendall(ping)
        data = s.recv(65536)
    except TimeoutError:
        break  # not served, nor answered: the proxy is out of descriptors
    except OSError:
        data = b""
    ok += data.startswith(b"HTTP/1.1 200 OK")
    held.append(s)
print(ok, flush=True)
sys.stdin.read()
"""


def test_one_clients_idle_connections_leave_room_for_the_others(engine, tmp_path) -> None:
    def few_files() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))

    # 256 descriptors: (256 - 64) // 6 = 32 connections at once, 8 for one client.
    rules = ("* exitwatch-hog *",)
    with adopting(engine, rules, logs=tmp_path, preexec=few_files) as adopt:
        hog = subprocess.Popen(
            [sys.executable, "-c", HOG, str(adopt.listen), "200", "exitwatch-hog", "x"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert hog.stdout is not None
            ok = int(hog.stdout.readline())
            # Its connections stay open; another client (this one, nobody's) is served.
            assert _answer(adopt.listen).startswith(b"HTTP/1.1 200 OK"), adopt.text()[-2000:]
            assert 1 <= ok <= 8, ok
            assert "this client holds 8 connections already" in adopt.text()
        finally:
            hog.kill()
            hog.wait()
