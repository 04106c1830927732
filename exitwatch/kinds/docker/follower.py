"""One engine followed: its labelled containers, networks and volumes listed, its events
stream followed, and removals on it that take a compose project as a whole. The container
kind (kind.py) has one Follower per engine, each with its own thread, client and bound on
requests, so that a slow or lying engine holds up no other; a follower knows nothing of the
others, and its resources' keys are the engine's own (labels.py). What the engine's
listings and events mean is events.py's."""

from __future__ import annotations

import functools
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypedDict

from exitwatch.contract import LABEL_OWNER
from exitwatch.engine import api
from exitwatch.engine.client import ENGINE_ERRORS, Client
from exitwatch.engine.errors import describe
from exitwatch.engine.url import Endpoint
from exitwatch.kinds.base import (
    Found,
    Gone,
    Notify,
    Outcome,
    Resource,
    Snapshot,
    Unavailable,
)
from exitwatch.kinds.discovery import Discovery, stopped, wait
from exitwatch.kinds.docker import compose, events, networks, pods, projects
from exitwatch.kinds.docker.attempts import EngineError, attempt, name_of
from exitwatch.kinds.docker.labels import (
    CONTAINER,
    KIND,
    NETWORK,
    other_of,
    resource_of,
    split,
)
from exitwatch.owner import Owner

log = logging.getLogger(__name__)

TIMEOUT = 15.0  # seconds, for every engine call but the events stream
# Engine calls of removals at once (Config.engine_concurrency), over every removal job of
# the process; docs/benchmarks.md has the figures.
CONCURRENCY = 16
BACKOFF_MIN, BACKOFF_MAX = 0.1, 5.0  # seconds between reconnects to the events stream
# The engine answers an events request before it subscribes, so a subscription asks for a
# replay from just before it was requested. The engine is local: its clock is ours.
SINCE_MARGIN_NS = 100_000_000
# Seconds between listings of the networks of an engine whose events leave them out
# (podman 4.3): a network made by an owner that dies is known within this.
NETWORK_POLL = 1.0


_container = projects.container


class EngineHealth(TypedDict, total=False):
    """One engine's entry of the status document: all four from a running agent, the first
    two (and last_error when it failed) from a one-shot scan."""

    endpoint: str
    connected: bool
    reconnects: int
    last_error: str | None


class Follower:
    """One engine's containers labelled `exitwatch.owner`; those labelled
    `exitwatch.keep=true` are exempt.

    Health for status, written by the watching thread: `connected` (following the events
    stream now), `reconnects` (times it was followed again after being lost) and `last_error`
    (why it was last lost, or None).
    """

    def __init__(
        self,
        endpoint: Endpoint,
        timeout: float = TIMEOUT,
        concurrency: int = CONCURRENCY,
        client: api.Connect = Client,
    ) -> None:
        """`client` makes a client of the engine (a fake one, in tests)."""
        self.endpoint = endpoint
        self.host: str = endpoint.url
        self._client, self._timeout = client, timeout
        # One bound on the engine for every removal job at once: a dead owner with 1,000
        # containers, or 100 dead owners, send `concurrency` requests, not jobs x threads.
        self._engine = client(self.endpoint, timeout, concurrency)
        self._removers = ThreadPoolExecutor(concurrency, thread_name_prefix="exitwatch-rm")
        self.connected = False
        self.reconnects = 0
        self.last_error: str | None = None
        self._since: str | None = None
        self._followed = self._down = False
        self._lock = threading.Lock()
        self._stream: api.Events | None = None
        # The boot time (compose.boot_time) as it was when each owner was first seen: a
        # clock stepped since then is told by it (compose.started_at).
        self._seen: dict[Owner, float] = {}
        self._discovery = Discovery(
            "docker events thread", "exitwatch-docker-events", wake=self._close_stream
        )

    def health(self) -> EngineHealth:
        return {
            "endpoint": self.host,
            "connected": self.connected,
            "reconnects": self.reconnects,
            "last_error": self.last_error,
        }

    def scan_health(self, error: Unavailable | None) -> EngineHealth:
        if error is None:
            return {"endpoint": self.host, "connected": True}
        return {"endpoint": self.host, "connected": False, "last_error": str(error)}

    def ping(self) -> str | None:
        """None when the engine answers; otherwise one line naming it and saying why not."""
        try:
            self._engine.ping()
        except ENGINE_ERRORS as err:
            return f"no Docker engine answers at {self.host}: {describe(err)}"
        return None

    def scan(self) -> Snapshot:
        """Every labelled container now. Raises EngineError when the engine does not answer."""
        try:
            return self._sighted(events.snapshot(self._engine))
        except ENGINE_ERRORS as err:
            raise EngineError(f"docker engine at {self.host}: {describe(err)}") from err

    def _sighted(self, snap: Snapshot) -> Snapshot:
        """Note when each owner of a whole listing was first seen; forget those gone."""
        booted = compose.boot_time()
        owners = {r.owner for r in snap.resources}
        with self._lock:
            self._seen = {o: self._seen.get(o, booted) for o in owners}
        return snap

    def _seen_boot(self, owner: Owner) -> float | None:
        with self._lock:
            return self._seen.get(owner)

    # -- watching ------------------------------------------------------------------------------

    def start(self, notify: Notify) -> None:
        self._discovery.start(lambda stop_fd: self._watch(notify, stop_fd))

    def stop(self) -> None:
        self._discovery.stop()
        self._engine.close()
        # What runs goes on; nothing new starts (an engine no longer followed).
        self._removers.shutdown(wait=False)
        self.connected = False

    def _close_stream(self) -> None:
        with self._lock:
            stream, self._stream = self._stream, None
        if stream is not None:
            try:
                stream.close()
            except ENGINE_ERRORS as err:
                log.debug("closing the docker events stream: %s", describe(err))

    def _watch(self, notify: Notify, stop_fd: int) -> None:
        delay = BACKOFF_MIN
        while not stopped(stop_fd):
            # A client per connection: it asks the API version of the engine that answers now,
            # and a stream stuck on a dead engine holds nothing that removals need.
            engine = self._client(self.endpoint, self._timeout, 0)
            try:
                self._follow(engine, notify, stop_fd)
                problem = "the events stream ended"
            except Exception as err:
                # Closing the stream under the reader makes it raise whatever it likes.
                if stopped(stop_fd):
                    break
                if isinstance(err, ENGINE_ERRORS):
                    problem = describe(err)
                else:  # a bug, ours or notify's: the thread must outlive it, and say so
                    log.exception("docker events thread: unexpected error")
                    problem = f"unexpected error: {err!r}"
            finally:
                self._close_stream()
                engine.close()
            if stopped(stop_fd):
                break
            # The engine that answers next may be another (restarted, upgraded): the
            # removals ask its API version again.
            self._engine.close()
            if self.connected:
                delay = BACKOFF_MIN
            self.connected = False
            self.last_error = problem
            if not self._down:
                log.warning("docker engine at %s: %s; reconnecting", self.host, problem)
            self._down = True
            if wait(stop_fd, None, delay):
                break
            delay = min(delay * 2, BACKOFF_MAX)

    def _follow(self, engine: api.Engine, notify: Notify, stop_fd: int) -> None:
        """Subscribe first, then report a Snapshot, then each event until the stream ends."""
        since = self._since or events.ns_time(time.time_ns() - SINCE_MARGIN_NS)
        stream = engine.events(since, events.TYPES)
        with self._lock:
            # A stop asked for before the stream was kept here found none to close.
            if stopped(stop_fd):
                stream.close()
                return
            self._stream = stream
        snap = self._sighted(events.snapshot(engine))
        notify(snap)
        if self._followed:
            self.reconnects += 1
        if self._down:
            log.info("docker engine at %s answers again; following its events", self.host)
        self._followed, self._down, self.connected = True, False, True
        done = threading.Event()
        if not engine.network_events():  # podman: its networks are listed again and again
            networks = {r.key: r for r in snap.resources if split(r.key)[0] == NETWORK}
            threading.Thread(
                target=self._poll_networks,
                args=(engine, networks, notify, done),
                name="exitwatch-networks",
                daemon=True,
            ).start()
        try:
            for event in stream:
                if isinstance(event, dict):
                    self._on_event(engine, event, notify)
        finally:
            done.set()

    def _poll_networks(
        self, engine: api.Engine, known: dict[str, Resource], notify: Notify, done: threading.Event
    ) -> None:
        """For an engine whose events tell nothing of networks: its labelled networks,
        listed every NETWORK_POLL s while its stream is followed, each one made or gone
        told as its event would have. A listing that fails proves nothing: the stream's
        end says when the engine is gone."""
        while not done.wait(NETWORK_POLL):
            try:
                listed = [other_of(KIND, NETWORK, n) for n in engine.networks(LABEL_OWNER)]
            except ENGINE_ERRORS as err:
                log.debug("listing the networks of %s: %s", self.host, describe(err))
                continue
            now = {r.key: r for r in listed if r is not None}
            for key, res in now.items():
                if known.get(key) != res:
                    with self._lock:
                        self._seen.setdefault(res.owner, compose.boot_time())
                    notify(Found(res))
            for key in known.keys() - now.keys():
                notify(Gone(KIND, key))
            known = now

    def _on_event(self, engine: api.Engine, event: dict[str, Any], notify: Notify) -> None:
        nano = event.get("timeNano")
        if isinstance(nano, int):
            # Resume just after it: `since` includes events of that very nanosecond.
            self._since = events.ns_time(nano + 1)
        change = events.change(engine, event)
        if isinstance(change, Found):
            with self._lock:
                self._seen.setdefault(change.resource.owner, compose.boot_time())
        if change is not None:
            notify(change)

    # -- removal -------------------------------------------------------------------------------

    def refused(self, res: Resource, why: str) -> Outcome:
        type_, ident = split(res.key)
        if type_ != CONTAINER:
            extra = {"id": ident, "project": res.group}
            return Outcome.refusal(res.name, type_, why, key=res.key, extra=extra)
        return Outcome.refusal(why=why, key=res.key, **_container(res.key, res.name, res.group))

    def what(self, res: Resource) -> str:
        type_, ident = split(res.key)
        return res.name if type_ != CONTAINER else f"container {ident[:12]} ({res.name})"

    def remove(
        self, owner: Owner, resources: list[Resource], dry_run: bool, how: str
    ) -> list[Outcome]:
        """Its pods (podman's, pods.py) and containers first, compose projects as a whole
        (projects.py); then the networks and volumes, its own and its whole projects', once
        no container uses them (networks.py). A job may hold no container: networks and
        volumes carry owners too, and one whose containers went before it (`compose down`
        without -v) left them."""
        outcomes = [
            self.refused(r, f"owned by {r.owner}, not {owner}")
            for r in resources
            if r.owner != owner
        ]
        mine = [r for r in resources if r.owner == owner]
        boxes = [r for r in mine if split(r.key)[0] == CONTAINER]
        # id -> (name, project): everything that goes, decided before anything is removed.
        doomed: dict[str, tuple[str, str | None]] = {
            r.key: (r.name, None) for r in boxes if r.group is None
        }
        whole = []
        since = compose.started_at(owner, self._seen_boot(owner))
        # A project of its networks and volumes alone is judged too: one whose containers
        # remain (a live owner's, an unlabelled production one's) keeps them.
        groups = sorted({r.group for r in mine if r.group is not None})
        for project in groups:
            given = [r for r in boxes if r.group == project]
            targets, is_whole, said = projects.plan(self._engine, owner, project, given, since)
            outcomes += said
            doomed.update((cid, (name, project)) for cid, name in targets.items())
            if is_whole:
                whole.append(project)

        def one(item: tuple[str, tuple[str, str | None]]) -> Outcome:
            cid, (name, project) = item
            if dry_run:
                return Outcome.done(
                    detail="dry run: would remove", **_container(cid, name, project)
                )
            ok, detail = attempt(functools.partial(self._engine.remove_container, cid))
            return Outcome(ok=ok, detail=detail, **_container(cid, name, project))

        # Podman's pods first: their infra containers go only with them.
        podded = pods.labelled(self._engine, owner, dry_run)
        outcomes += podded.outcomes
        for r in boxes:
            if r.key in podded.spared:
                outcomes.append(self.refused(r, podded.spared.pop(r.key)))
                doomed.pop(r.key, None)
        if doomed:
            outcomes += self._removers.map(one, doomed.items())
        keys = {r.key for r in mine}
        for project in whole:
            outcomes += networks.of_project(self._engine, owner, project, since, dry_run, keys)
        held = {p for p in groups if p not in whole}
        return outcomes + networks.labelled(self._engine, owner, dry_run, outcomes, held, keys)

    # -- what an ended run holds: networks and volumes are labelled as containers are ------

    def owned(self, owner: Owner) -> list[Resource]:
        """The containers labelled with `owner` now. Raises EngineError."""
        try:
            listed = self._engine.containers(f"{LABEL_OWNER}={owner}")
        except ENGINE_ERRORS as err:
            raise EngineError(f"docker engine at {self.host}: {describe(err)}") from err
        found = (resource_of(KIND, c["Id"], name_of(c), c.get("Labels") or {}) for c in listed)
        return [r for r in found if r is not None and r.owner == owner]
