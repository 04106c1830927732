"""What every actor of the soak is: a pool of live owners of one kind, a few that live from
start to end, and the dead, with the checks each round and at the end; and the engine as
one listing, which the checks of a round share."""

from __future__ import annotations

import os
import pwd
import random
import threading
import time
import traceback
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import docker


@dataclass(frozen=True)
class View:
    """What the engine holds at one moment: container ids, network and volume names."""

    containers: frozenset[str]
    networks: frozenset[str]
    volumes: frozenset[str]

    @classmethod
    def now(cls, api: docker.APIClient) -> View:
        return cls(
            frozenset(c["Id"] for c in api.containers(all=True)),
            frozenset(n["Name"] for n in api.networks()),
            frozenset(v["Name"] for v in api.volumes()["Volumes"] or []),
        )


@dataclass
class Ground:
    """What the soak gives every actor: its engine, the agent's workdir root and hook spool,
    a directory for results and logs, the users, and the random choices."""

    host: str  # the engine's DOCKER_HOST
    root: Path  # the agent's one workdir root
    spool: Path  # the agent's hook spool (the agent made it)
    results: Path  # where hooks write what they did (anyone may search it)
    logs: Path  # kept after the soak
    users: list[pwd.struct_passwd]  # unprivileged, each hook actor takes one
    rng: random.Random
    clients: list[docker.APIClient] = field(default_factory=list)

    def api(self) -> docker.APIClient:
        """A client of the actor's own: docker-py's are not to be shared between threads."""
        client = docker.APIClient(base_url=self.host)
        self.clients.append(client)
        return client

    def env(self, **extra: str) -> dict[str, str]:
        """The environment for the docker CLI and compose, pointed at this engine alone."""
        mine = {k: v for k, v in os.environ.items() if not k.startswith(("DOCKER_", "COMPOSE_"))}
        return mine | {"DOCKER_HOST": self.host} | extra

    def random(self) -> random.Random:
        """A generator of the actor's own, so that its choices do not hang on the others'."""
        return random.Random(self.rng.random())


@dataclass
class Owned:
    """One owner an actor made."""

    name: str  # how a violation line names it: its kind and its owner string
    row: str  # the table row it counts in: its kind, and how it is to end
    owner: str  # its owner string, as the agent's audit log names it
    steady: bool = False
    born: float = field(default_factory=time.monotonic)
    died: float | None = None  # the wall time it was ended at
    ended_by: str = ""  # how: "SIGKILL", "SIGKILL of CMD", "cancelled", ...


class Actor(ABC):
    """One kind of owner. Subclasses make owners, end them, and say which of an owner's
    resources are missing (of a live one) or left (of a dead one).

    The soak calls `setup` before its clock starts, then `round` on the actor's own thread
    until the end, then `finish`, `leaks` until they are none (or a deadline), `contract`,
    and `close`, all from the main thread; `rss` is called from the sampler's thread.
    """

    name = "actor"
    live_target = 4  # owners alive at any moment besides the steady ones
    steady_count = 2  # owners that live from start to end
    min_age = 0.0  # seconds an owner lives at least: what it holds is set up by then
    period = 0.0  # seconds between two rounds at least

    def __init__(self, ground: Ground) -> None:
        self.ground = ground
        self.rng, self.api = ground.random(), ground.api()
        self.live: list[Owned] = []
        self.steady: list[Owned] = []
        self.dead: list[Owned] = []
        self.made: Counter[str] = Counter()  # row -> owners
        self.killed: Counter[str] = Counter()  # row -> owners ended by a signal
        self.wrong: dict[tuple[str, str], str] = {}  # (owner, resource) -> its line
        self.left: list[tuple[Owned, str]] = []  # what the last leaks() found
        self.errors: list[str] = []
        self._lock = threading.Lock()  # live and dead, which the sampler reads

    # -- what a kind says --------------------------------------------------------------------

    @abstractmethod
    def make(self, steady: bool) -> Owned:
        """A new live owner with everything it holds in place."""

    @abstractmethod
    def end(self, owned: Owned) -> None:
        """End it (SIGKILL, mostly, as its row says); set its `died` and `ended_by`."""

    @abstractmethod
    def missing(self, owned: Owned, view: View) -> list[str]:
        """What is wrong with what a live owner holds ("container X is gone"), a phrase each."""

    @abstractmethod
    def remains(self, owned: Owned, view: View) -> list[str]:
        """What a dead owner left, one phrase each."""

    def contract(self, audit: Sequence[dict]) -> list[str]:
        """Once the leaks settled: every other violation of this kind, one line each;
        `audit` is the agent's audit log, oldest entry first."""
        return []

    def close(self) -> None:
        """End the steady owners (the agent still runs)."""
        for owned in self.steady:
            self.end(owned)

    def rss(self) -> dict[str, int]:
        """Column -> RSS in KiB of the processes of this kind's own to sample (a service
        the owners run through); none by default."""
        return {}

    def figures(self) -> dict:
        """This kind's own figures for the summary (a hook's start delays, say)."""
        return {}

    def rows(self) -> list[str]:
        """The table rows of this kind, in order."""
        return list(self.made)

    def hook_runs(self, row: str) -> int | None:
        """How many hook runs the owners of `row` had; None where hooks are not its kind."""
        return None

    # -- the rounds ----------------------------------------------------------------------------

    def setup(self) -> None:
        """The steady owners and a full pool (one at a time: a failure leaves none unheld)."""
        for _ in range(self.steady_count):
            self.steady.append(self._made(self.make(True)))
        for _ in range(self.live_target):
            self.live.append(self._made(self.make(False)))

    def round(self) -> None:
        """End one live owner old enough, at random; make another; check the live ones."""
        ripe = [o for o in self.live if time.monotonic() - o.born >= self.min_age]
        if ripe:
            victim = self.rng.choice(ripe)
            self._end(victim)
        if len(self.live) < self.live_target:
            owned = self._made(self.make(False))
            with self._lock:
                self.live.append(owned)
        self.check_live(View.now(self.api))

    def run(self, stop: threading.Event) -> None:
        """Rounds until `stop`; an exception ends this actor's rounds and is a violation."""
        try:
            while not stop.is_set():
                began = time.monotonic()
                self.round()
                stop.wait(max(0.0, self.period - (time.monotonic() - began)))
        except Exception:  # whatever broke, the soak must say it and go on
            self.errors.append(f"{self.name}: its rounds stopped: {traceback.format_exc()}")

    def check_live(self, view: View) -> None:
        for owned in self.steady + self.live:
            for what in self.missing(owned, view):
                key = (owned.name, what)
                self.wrong.setdefault(key, f"wrong removal: {owned.name}: {what}")

    def finish(self) -> None:
        """End every live owner but the steady ones, each once it is `min_age` old: a run
        made in the last round and killed at once had its leftover unseen by the agent, and
        another agent on a shared host killed it (caught in a mutant run: no removal of it
        in this agent's audit log)."""
        for owned in list(self.live):
            time.sleep(max(0.0, owned.born + self.min_age - time.monotonic()))
            self._end(owned)

    def leaks(self, view: View) -> list[str]:
        """One line for each resource a dead owner left, as it is now."""
        self.left = [(o, what) for o in self.dead for what in self.remains(o, view)]
        return [f"leak: {o.name} (ended by {o.ended_by}): {what}" for o, what in self.left]

    def kills(self) -> int:
        with self._lock:
            return sum(self.killed.values())

    def _made(self, owned: Owned) -> Owned:
        self.made[owned.row] += 1
        return owned

    def _end(self, owned: Owned) -> None:
        with self._lock:
            self.live.remove(owned)
        self.end(owned)
        with self._lock:
            self.dead.append(owned)
            if owned.ended_by.startswith("SIGKILL"):
                self.killed[owned.row] += 1
