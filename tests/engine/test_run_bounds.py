"""What the run's socket holds of creation bodies: the wrapper's RSS, sampled all along, while
its command sends creates near the body limit four at a time, through a real `exitwatch
run` in front of the private engine (once, 4 parallel 40 MiB creates took it to 381 MB)."""

from __future__ import annotations

import subprocess
import sys
import threading

import psutil

from exitwatch.contract import LABEL_OWNER
from exitwatch.proxy.creation import MAX_VALUES
from exitwatch.proxy.reader import MAX_BODY

from support.wrapper import RUN, env_for

PARALLEL, ROUNDS = 4, 3
GROWTH_MB = 40  # what the wrapper may grow by, over its RSS before the creates

# CMD: waits for a line on stdin (the test takes the wrapper's RSS before), then makes
# ROUNDS rounds of PARALLEL creates at once, each of a body of about SIZE bytes: of long
# strings, of as many small values as the socket reads, and of characters of 4 bytes in
# UTF-8 (once labelled as escapes of 12: review F5); prints each status.
CREATES = r"""
import json, os, socket, sys, threading
path = os.environ["DOCKER_HOST"].removeprefix("unix://")
image, size, values, parallel, rounds = sys.argv[1], *map(int, sys.argv[2:])
env = ["V%d=%s" % (i, "x" * 4000) for i in range(size // 4010)]
long = {"Image": image, "Cmd": ["true"], "Env": env}
many = {"Image": image, "Cmd": ["true"], "Env": ["A="] * (values - 8)}
wide = {"Image": image, "Cmd": ["true"], "Env": ["W=" + "\U0001F600" * (size // 4)]}
bodies = [json.dumps(long).encode(), json.dumps(many).encode()]
bodies.append(json.dumps(wide, ensure_ascii=False).encode())
print("ready", flush=True)
sys.stdin.readline()
statuses = []
def create(body):
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(120)
        s.connect(path)
        s.sendall(b"POST /containers/create HTTP/1.1\r\nHost: d\r\n"
                  b"Content-Type: application/json\r\nContent-Length: %d\r\n"
                  b"Connection: close\r\n\r\n" % len(body) + body)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    statuses.append(answer.split(b" ")[1].decode())
for n in range(rounds):
    body = bodies[n % 3]
    threads = [threading.Thread(target=create, args=(body,)) for _ in range(parallel)]
    for t in threads: t.start()
    for t in threads: t.join()
print(" ".join(statuses), flush=True)
sys.stdin.readline()
"""


# CMD: as above, then opens COUNT connections that each send a request head of SIZE bytes,
# short of its end, and prints "held" a few seconds on, with the heads still coming.
HEADS = r"""
import os, socket, sys, threading, time
path = os.environ["DOCKER_HOST"].removeprefix("unix://")
count, size = map(int, sys.argv[1:])
head = b"GET /_ping HTTP/1.1\r\nHost: x\r\n" + b"X: %s\r\n" % (b"a" * 1000) * (size // 1005)
print("ready", flush=True)
sys.stdin.readline()
def hold():
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    held.append(s)
    try:
        s.sendall(head)
    except OSError:
        pass
held = []
for _ in range(count):
    threading.Thread(target=hold, daemon=True).start()
time.sleep(3)
print("held", flush=True)
sys.stdin.readline()
"""
HEAD_GROWTH_MB = 20  # 40 heads of 1 MB once took it up by 80 (review F4)


def test_many_long_request_heads_keep_the_wrapper_small(engine, bases) -> None:
    proc = subprocess.Popen(
        [*RUN, "--", sys.executable, "-c", HEADS, "40", str(1000 * 1000)],
        env=env_for(bases, engine),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        before, peak, said = sampled(proc)
        assert said == ["held"]
        assert proc.wait(timeout=120) == 0
    finally:
        proc.kill()
        proc.wait()
    growth = (peak - before) / 2**20
    print(f"wrapper RSS {before / 2**20:.1f} MB before, {peak / 2**20:.1f} MB at most")
    assert growth <= HEAD_GROWTH_MB, f"the wrapper grew by {growth:.1f} MB"


def sampled(proc: subprocess.Popen) -> tuple[int, int, list[str]]:
    """The RSS of the wrapper `proc` once its CMD is ready, and at most while CMD does its
    work (from "go" to the line it prints then, which is returned split); CMD is then told
    to end."""
    wrapper = psutil.Process(proc.pid)
    assert proc.stdout.readline() == "ready\n"
    before = wrapper.memory_info().rss
    peak, stop = [before], threading.Event()

    def sample() -> None:
        while not stop.wait(0.002):
            peak[0] = max(peak[0], wrapper.memory_info().rss)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    proc.stdin.write("go\n")
    proc.stdin.flush()
    said = proc.stdout.readline().split()
    stop.set()
    sampler.join()
    proc.stdin.write("end\n")
    proc.stdin.flush()
    return before, peak[0], said


def test_parallel_creates_near_the_limit_keep_the_wrapper_small(engine, bases) -> None:
    args = [str(MAX_BODY - 8192), str(MAX_VALUES), str(PARALLEL), str(ROUNDS)]
    proc = subprocess.Popen(
        [*RUN, "--", sys.executable, "-c", CREATES, engine.image, *args],
        env=env_for(bases, engine),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        before, peak, statuses = sampled(proc)
        assert proc.wait(timeout=120) == 0
    finally:
        proc.kill()
        proc.wait()
    assert statuses == ["201"] * PARALLEL * ROUNDS
    growth = (peak - before) / 2**20
    print(f"wrapper RSS {before / 2**20:.1f} MB before, {peak / 2**20:.1f} MB at most")
    assert growth <= GROWTH_MB, f"the wrapper grew by {growth:.1f} MB"
    # What they made went with the run, labelled.
    assert engine.client.api.containers(all=True, filters={"label": LABEL_OWNER}) == []
