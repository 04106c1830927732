"""The figures sampled throughout: the agent's RSS, open fds and threads, and the RSS of the
processes each actor names (`Actor.rss`: the wrappers of `exitwatch run`, the adopt
service), with the owners ended so far, every SAMPLE_EVERY seconds on a thread of its own."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from .actor import Actor

SAMPLE_EVERY = 10.0  # seconds


def _status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


def rss_kib(pid: int) -> int | None:
    """The RSS of `pid` in KiB; None once it is gone."""
    try:
        return int(_status(pid)["VmRSS"].split()[0])
    except (OSError, KeyError):
        return None


@dataclass
class Sample:
    t: float  # seconds since the clock started
    rss: int  # the agent's, KiB
    fds: int
    threads: int
    killed: int  # owners ended by a signal so far, over all actors
    others: dict[str, int] = field(default_factory=dict)  # the actors' columns


def sample(pid: int, began: float, actors: Sequence[Actor]) -> Sample:
    status = _status(pid)
    others: dict[str, int] = {}
    for actor in actors:
        others |= actor.rss()
    return Sample(
        t=time.monotonic() - began,
        rss=int(status["VmRSS"].split()[0]),
        fds=len(os.listdir(f"/proc/{pid}/fd")),
        threads=int(status["Threads"]),
        killed=sum(a.kills() for a in actors),
        others=others,
    )


class Sampler:
    """Samples the agent `pid` and `actors` from start() until stop(), and once more then."""

    def __init__(self, pid: int, actors: Sequence[Actor]) -> None:
        self.pid, self.actors = pid, actors
        self.samples: list[Sample] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-sampler", daemon=True)
        self.began = 0.0

    def start(self, began: float) -> None:
        self.began = began
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self._take()

    def _run(self) -> None:
        due = self.began
        while not self._stop.wait(max(0.0, due - time.monotonic())):
            self._take()
            due += SAMPLE_EVERY

    def _take(self) -> None:
        try:
            self.samples.append(sample(self.pid, self.began, self.actors))
        except OSError as err:  # the agent is gone: the main loop says so
            self.errors.append(f"sampling the agent: {err}")
