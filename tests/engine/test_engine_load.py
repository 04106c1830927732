"""The load a bulk reap puts on the engine: `engine_concurrency` bounds the requests under
way at once over every removal of the process, against the suite's private engine."""

from __future__ import annotations

import threading

import pytest

from exitwatch.contract import LABEL_OWNER
from exitwatch.kinds.docker import engine as engine_client
from exitwatch.kinds.docker.kind import Containers
from exitwatch.owner import Owner
from exitwatch.service.config import Config
from exitwatch.service.daemon import make_kinds

from support.engine import PrivateEngine
from support.procs import killed_owner


class InFlight:
    """Counts the container DELETEs under way at once; each still goes to the real engine."""

    def __init__(self, real) -> None:
        self._real = real
        self._lock = threading.Lock()
        self.now = self.most = self.calls = 0

    def __call__(self, path: str, method: str, url: str, timeout: float) -> bytes:
        if method != "DELETE" or "/containers/" not in url:
            return self._real(path, method, url, timeout)
        with self._lock:
            self.now += 1
            self.calls += 1
            self.most = max(self.most, self.now)
        try:
            return self._real(path, method, url, timeout)
        finally:
            with self._lock:
                self.now -= 1


def owned(engine: PrivateEngine, n: int) -> tuple[Owner, list[str]]:
    """A dead owner with `n` created containers."""
    owner = killed_owner()
    api = engine.client.api
    made = [
        api.create_container(engine.image, labels={LABEL_OWNER: str(owner)})["Id"] for _ in range(n)
    ]
    return owner, made


def test_removals_of_many_dead_owners_at_once_stay_within_engine_concurrency(
    engine: PrivateEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each job used to start 16 threads of its own: three owners reaped side by side sent
    # up to 48 DELETEs at once, whatever the setting.
    spy = InFlight(engine_client.request)
    monkeypatch.setattr(engine_client, "request", spy)
    # As the agent and `exitwatch reap` make it, from the setting.
    settings = {"docker_host": engine.host, "engine_concurrency": 4}
    kind = make_kinds(Config().updated(settings))["container"]
    assert isinstance(kind, Containers)
    try:
        owners = [owned(engine, 40) for _ in range(3)]
        listing = kind.scan().resources
        jobs = [
            threading.Thread(
                target=kind.reap, args=(o, [r for r in listing if r.owner == o], False)
            )
            for o, _ in owners
        ]
        for job in jobs:
            job.start()
        for job in jobs:
            job.join(120)
        left = {c["Id"] for c in engine.client.api.containers(all=True)}
        assert not left & {c for _, made in owners for c in made}
        # Parallel, and bounded: at most 4 at once, however many jobs.
        assert spy.calls == 120
        assert 2 <= spy.most <= 4, spy.most
    finally:
        kind.stop()
