"""`exitwatch adopt`'s cost: the same Docker calls through its socket and directly, in the
same run, against the same engine. The benchmark's own process is the client, and a rule
names its command line, so that every connection is attributed (its process read from
/proc) and every creation labelled, as a runner's would be.

- a new connection and `_ping`, attribution included, and create+start: alternated between
  the two sockets, the overhead taken per trial (wrapper.py's method);
- a stream: an exec's output of STREAM_BYTES, the ratio of the median throughputs;
- `GET /containers/json` from LIST_CLIENTS clients at once, each on a connection of its
  own: requests a second through either socket, the ratio of the medians of LIST_ROUNDS;
- CLIENTS clients at once, each held open until all have had their `_ping` answered, then
  listing; every failure counted;
- the service's peak RSS, sampled all along, and apart during a `docker cp` of CP_BYTES out
  of a container.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import docker

from bench.engine import Engine
from bench.wrapper import Peak, paired

LIST_CLIENTS = 32
LIST_REQUESTS = 50  # per client and round
LIST_ROUNDS = 4  # even
CLIENTS = 256
PING = b"GET /_ping HTTP/1.1\r\nHost: docker\r\n\r\n"
LIST = b"GET /containers/json HTTP/1.1\r\nHost: docker\r\nConnection: close\r\n\r\n"


def _serve(engine: Engine, where: str) -> tuple[subprocess.Popen, str]:
    """`exitwatch adopt` in front of `engine`, with a rule that matches this process."""
    with open("/proc/self/cmdline", "rb") as f:
        me = " ".join(a.decode() for a in f.read().rstrip(b"\0").split(b"\0"))
    path = os.path.join(where, "docker.sock")
    log = os.path.join(where, "adopt.log")
    argv = [sys.executable, "-m", "exitwatch", "adopt", "--listen", path]
    argv += ["--docker-host", engine.host, "--rule", glob.escape(me)]
    with open(log, "wb") as err:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stderr=err, env=engine.env())
    deadline = time.monotonic() + 60
    while b"ready: serving" not in Path(log).read_bytes():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise RuntimeError(f"exitwatch adopt did not start: {Path(log).read_bytes()[-500:]!r}")
        time.sleep(0.05)
    return proc, f"unix://{path}"


def _lists_per_s(host: str, requests: int) -> float:
    """Requests a second of LIST_CLIENTS clients at once, each listing `requests` times."""
    apis = [docker.APIClient(base_url=host, timeout=120) for _ in range(LIST_CLIENTS)]
    try:
        for api in apis:
            api.ping()  # connected and attributed beforehand: the listing alone is timed
        start = threading.Barrier(LIST_CLIENTS + 1)

        def client(api: docker.APIClient) -> None:
            start.wait()
            for _ in range(requests):
                api.containers()

        with ThreadPoolExecutor(LIST_CLIENTS) as pool:
            done = [pool.submit(client, api) for api in apis]
            start.wait()
            t0 = time.perf_counter()
            for d in done:
                d.result()
            took = time.perf_counter() - t0
    finally:
        for api in apis:
            api.close()
    return LIST_CLIENTS * requests / took


def _held_clients(path: str) -> list[str]:
    """CLIENTS connections at once, each held until all are answered; what failed."""
    answered: list[int] = []
    everyone = threading.Event()

    def client(n: int) -> str | None:
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(120)
                s.connect(path)
                s.sendall(PING)
                data = b""
                while not data.endswith(b"\r\n\r\nOK"):
                    chunk = s.recv(65536)
                    if not chunk:
                        return f"client {n}: closed after {data[:80]!r}"
                    data += chunk
                answered.append(n)
                if len(answered) == CLIENTS:
                    everyone.set()
                if not everyone.wait(120):
                    return f"client {n}: {len(answered)} of {CLIENTS} answered in 120 s"
                s.sendall(LIST)
                while chunk := s.recv(65536):
                    data += chunk
                if data.count(b"HTTP/1.1 200 OK") != 2:
                    return f"client {n}: {data[:80]!r}"
                return None
        except Exception as err:
            return f"client {n}: {type(err).__name__}: {err}"

    with ThreadPoolExecutor(CLIENTS) as pool:
        return [f for f in pool.map(client, range(CLIENTS)) if f]


def _cp_out(api: docker.APIClient, cid: str, size: int) -> float:
    """MB/s of `docker cp` of a file of `size` bytes out of the container, as the CLI
    streams it (GET .../archive)."""
    stream_, _ = api.get_archive(cid, "/tmp/big", chunk_size=1 << 20)
    t0 = time.perf_counter()
    got = sum(len(chunk) for chunk in stream_)
    took = time.perf_counter() - t0
    if got < size:
        raise RuntimeError(f"the archive ended after {got} of {size} bytes")
    return got / took / 1e6


def run(
    engine: Engine,
    trials: int,
    stream_bytes: int,
    cp_bytes: int,
    list_requests: int = LIST_REQUESTS,
) -> dict:
    where = tempfile.mkdtemp(prefix="exitwatch-bench-adopt-", dir="/tmp")
    adopt, through_host = _serve(engine, where)
    peak = Peak(adopt.pid)
    peak.start()
    made: list[str] = []
    try:
        direct_api = docker.APIClient(base_url=engine.host, timeout=300)
        adopt_api = docker.APIClient(base_url=through_host, timeout=300)
        figures, cid = paired(
            "adopt",
            (engine.host, direct_api),
            (through_host, adopt_api),
            trials,
            stream_bytes,
            made,
        )
        d_list, a_list = [], []
        for n in range(LIST_ROUNDS):
            pair = [(d_list, engine.host), (a_list, through_host)]
            for rates, host in pair if n % 2 else reversed(pair):
                rates.append(_lists_per_s(host, list_requests))
        failures = _held_clients(through_host.removeprefix("unix://"))
        serving = round(peak.peak / 2**20, 1)
        eid = direct_api.exec_create(cid, ["sh", "-c", f"head -c {cp_bytes} /dev/zero >/tmp/big"])
        direct_api.exec_start(eid["Id"])
        during_cp = Peak(adopt.pid)
        during_cp.start()
        cp_rate = _cp_out(adopt_api, cid, cp_bytes)
        cp_rss = during_cp.mb()
        direct_api.close()
        adopt_api.close()
    finally:
        adopt.terminate()
        adopt.wait(timeout=60)
        rss = peak.mb()
        engine.remove(made)
        shutil.rmtree(where, ignore_errors=True)
    return {
        # ping_ms: a new connection's _ping, the attribution included, no engine work.
        **figures,
        "list": {
            "clients": LIST_CLIENTS,
            "requests": list_requests,
            "direct_per_s": round(statistics.median(d_list)),
            "adopt_per_s": round(statistics.median(a_list)),
            "ratio": round(statistics.median(a_list) / statistics.median(d_list), 3),
        },
        "clients": CLIENTS,
        "client_failures": len(failures),
        "failures_shown": failures[:3],
        "cp": {"bytes": cp_bytes, "adopt_mb_s": round(cp_rate, 1), "rss_mb": cp_rss},
        "adopt_rss_mb": serving,
        "adopt_rss_mb_peak": rss,
        "adopt_exit": adopt.returncode,
    }


if __name__ == "__main__":  # a quick look: python -m bench.adopt [ENGINE_DIR]
    eng = Engine(sys.argv[1] if len(sys.argv) > 1 else "/tmp/exitwatch-bench-adopt")
    try:
        size = int(os.environ.get("BENCH_MB", "16")) << 20
        print(run(eng, int(os.environ.get("BENCH_TRIALS", "10")), size, size))
    finally:
        eng.close()
