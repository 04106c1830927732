"""`exitwatch run`'s cost: the same Docker calls through a run's socket and directly, in the
same run, against the same engine.

- create+start: `create` then `start` of a container, alternated between the two sockets;
  the overhead is the per-trial difference. Each container is waited for and removed,
  untimed, before the next is made: the engine is then as idle for either socket. A
  `_ping` on a new connection, likewise, shows the proxy's own cost apart from the engine.
- stream: an exec's output of STREAM_BYTES read off its hijacked connection; the ratio of
  the median throughputs.
- concurrency: CLIENTS clients at once, each on a connection of its own, each creating,
  starting, running an exec in and removing a container; every failure is counted.
- the wrapper's peak RSS, sampled all along: while it serves, and with its cleanup, which
  loads the Docker SDK that the agent's removal code uses.
"""

from __future__ import annotations

import io
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import docker
import psutil

from bench import stats
from bench.engine import IMAGE, Engine

STREAM_BYTES = 256 * 1024 * 1024
STREAM_ROUNDS = 6  # even: each socket goes first as often
CLIENTS = 64
# Waits for stdin to close, so the wrapper lives until the benchmark is done.
HOLD = "import os, sys; print(os.environ['DOCKER_HOST'], flush=True); sys.stdin.read()"


class Peak(threading.Thread):
    """Samples a process's RSS until stopped; the peak, in MB."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.proc, self.peak, self.done = psutil.Process(pid), 0, threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.05):
            try:
                self.peak = max(self.peak, self.proc.memory_info().rss)
            except psutil.NoSuchProcess:
                return

    def mb(self) -> float:
        self.done.set()
        self.join()
        return round(self.peak / 2**20, 1)


def create_start(api: docker.APIClient, made: list[str]) -> float:
    """ms to create and start a container of `true`; it is gone again when this returns
    (or left in `made` for the end)."""
    t0 = time.perf_counter()
    cid = api.create_container(IMAGE, "true")["Id"]
    made.append(cid)
    api.start(cid)
    took = (time.perf_counter() - t0) * 1000
    # Its exit and removal would otherwise overlap the next trial: the engine's jitter.
    api.wait(cid)
    api.remove_container(cid)
    made.remove(cid)
    return took


def ping_ms(host: str, trials: int) -> list[float]:
    """Round trips of _ping, each on a connection of its own as a docker CLI makes them."""
    path = host.removeprefix("unix://")
    out = []
    for _ in range(trials):
        t0 = time.perf_counter()
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(path)
            s.sendall(b"GET /_ping HTTP/1.1\r\nHost: docker\r\nConnection: close\r\n\r\n")
            while s.recv(4096):
                pass
        out.append((time.perf_counter() - t0) * 1000)
    return out


def hijacked(sock: Any) -> io.BufferedReader:
    """What to read an exec's output from, given the socket exec_start(socket=True) returns:
    the HTTP client's buffered reader over it. That socket is the raw one under the reader,
    and so is what exec_start(eid) reads the output from, its frames after the 101's head:
    whatever the reader took in with the head is lost (docker-py #2042, #3332). The output
    comes with the head when the client reads it late, directly or through the run's socket
    (all of it, then, in the reader's buffer), and through the run's socket also when the
    proxy passes the head on late, with the output that came meanwhile: on a busy host, one
    client of CLIENTS had an exec say b''."""
    return sock._response.raw._fp.fp


def exec_output(api: docker.APIClient, eid: str) -> bytes:
    """exec_start(eid) of an exec without a tty (stdout and stderr joined), read through
    hijacked(), so that the bytes the engine sent are the bytes counted."""
    sock = api.exec_start(eid, socket=True)
    reader, out = hijacked(sock), bytearray()
    while len(header := reader.read(8)) == 8:  # a frame: stream, 0, 0, 0, its length
        out += reader.read(int.from_bytes(header[4:], "big"))
    getattr(sock, "_sock", sock).close()
    return bytes(out)


def stream(api: docker.APIClient, cid: str, size: int) -> float:
    """MB/s of an exec writing `size` bytes to its stdout, read raw off the connection."""
    eid = api.exec_create(cid, ["head", "-c", str(size), "/dev/zero"])["Id"]
    t0 = time.perf_counter()
    sock = api.exec_start(eid, socket=True)
    raw: socket.socket = getattr(sock, "_sock", sock)
    reader = hijacked(sock)
    buf = bytearray(1 << 20)
    got = 0
    while n := reader.readinto1(buf):  # as recv_into once the reader's buffer is empty
        got += n
    took = time.perf_counter() - t0
    raw.close()
    if got < size:  # the frame headers make it a little more
        raise RuntimeError(f"the stream ended after {got} of {size} bytes")
    return got / took / 1e6


def paired(
    name: str,
    direct: tuple[str, docker.APIClient],
    other: tuple[str, docker.APIClient],
    trials: int,
    stream_bytes: int,
    made: list[str],
) -> tuple[dict, str]:
    """The direct socket and another in front of it (each its host and client), trial by
    trial: the figures of create+start, of `_ping` on a new connection and of an exec
    stream, the other's under `name`; and the id of the running container streamed from
    (in `made`)."""
    d_times, o_times, d_ping, o_ping = [], [], [], []
    for n in range(trials):
        # Each goes first in turn, so that neither pays alone for what the engine still
        # does in the background (its log and layer writes, say).
        pair = [(d_times, direct[1]), (o_times, other[1])]
        for times, api in pair if n % 2 else reversed(pair):
            times.append(create_start(api, made))
        d_ping += ping_ms(direct[0], 5)
        o_ping += ping_ms(other[0], 5)
    cid = direct[1].create_container(IMAGE, "sleep 1000")["Id"]
    made.append(cid)
    direct[1].start(cid)
    d_rate, o_rate = [], []
    for n in range(STREAM_ROUNDS):
        pair = [(d_rate, direct[1]), (o_rate, other[1])]
        for rates, api in pair if n % 2 else reversed(pair):
            rates.append(stream(api, cid, stream_bytes))
    figures = {
        # Each create+start through the socket against the direct one run beside it.
        "create_start_ms": {
            "direct": stats.summary(d_times),
            name: stats.summary(o_times),
            "overhead": stats.paired(o_times, d_times),
        },
        # The socket's own cost on a new connection, without the engine's work and jitter.
        "ping_ms": {
            "direct": stats.summary(d_ping),
            name: stats.summary(o_ping),
            "overhead": stats.paired(o_ping, d_ping),
        },
        "stream": {
            "bytes": stream_bytes,
            "direct_mb_s": round(statistics.median(d_rate), 1),
            f"{name}_mb_s": round(statistics.median(o_rate), 1),
            "ratio": round(statistics.median(o_rate) / statistics.median(d_rate), 3),
        },
    }
    return figures, cid


def _client_work(host: str, n: int) -> str | None:
    """One client's round; None, or what failed."""
    api = docker.APIClient(base_url=host, timeout=120)
    try:
        api.ping()
        cid = api.create_container(IMAGE, "sleep 1000", name=f"bench-wrapper-{n}")["Id"]
        api.start(cid)
        eid = api.exec_create(cid, ["echo", f"client {n}"])["Id"]
        out = exec_output(api, eid)
        api.remove_container(cid, force=True)
        return None if out == f"client {n}\n".encode() else f"client {n}: exec said {out!r}"
    except Exception as err:
        return f"client {n}: {type(err).__name__}: {err}"
    finally:
        api.close()


def run(
    engine: Engine, trials: int, stream_bytes: int = STREAM_BYTES, clients: int = CLIENTS
) -> dict:
    wrapper = subprocess.Popen(
        [sys.executable, "-m", "exitwatch", "run", "--", sys.executable, "-c", HOLD],
        env=engine.env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    peak = Peak(wrapper.pid)
    peak.start()
    made: list[str] = []
    try:
        proxied = wrapper.stdout.readline().strip()
        direct_api = docker.APIClient(base_url=engine.host, timeout=300)
        proxy_api = docker.APIClient(base_url=proxied, timeout=300)
        figures, _ = paired(
            "run", (engine.host, direct_api), (proxied, proxy_api), trials, stream_bytes, made
        )
        with ThreadPoolExecutor(clients) as pool:
            failures = [f for f in pool.map(_client_work, [proxied] * clients, range(clients)) if f]
        direct_api.close()
        proxy_api.close()
    finally:
        serving = round(peak.peak / 2**20, 1)  # before its cleanup imports the Docker SDK
        wrapper.stdin.close()
        wrapper.wait(timeout=120)
        rss = peak.mb()
        engine.remove(made)
    return {
        **figures,
        "clients": clients,
        "client_failures": len(failures),
        "failures_shown": failures[:3],
        "wrapper_rss_mb": serving,
        "wrapper_rss_mb_with_cleanup": rss,
        "wrapper_exit": wrapper.returncode,
    }


if __name__ == "__main__":  # a quick look: python -m bench.wrapper [ENGINE_DIR]
    eng = Engine(sys.argv[1] if len(sys.argv) > 1 else "/tmp/exitwatch-bench-wrapper")
    try:
        print(run(eng, int(os.environ.get("BENCH_TRIALS", "30"))))
    finally:
        eng.close()
