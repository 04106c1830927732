"""Containers labelled with an owner: label-filtered listing, the events stream, and removal
that takes a compose project as a whole."""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from exitwatch.contract import LABEL_COMPOSE_PROJECT, LABEL_OWNER, LABEL_OWNER_NAME, kept
from exitwatch.kinds.base import Found, Gone, Notify, Outcome, Resource, ResourceKind, Snapshot
from exitwatch.kinds.discovery import Discovery, stopped, wait
from exitwatch.kinds.docker import compose, networks
from exitwatch.kinds.docker.engine import (
    ENGINE_ERRORS,
    Engine,
    EngineError,
    Events,
    attempt,
    engine_error,
    name_of,
)
from exitwatch.kinds.docker.host import DEFAULT_HOST, socket_path
from exitwatch.owner import Owner, OwnerError, death

log = logging.getLogger(__name__)

KIND = "container"

TIMEOUT = 15.0  # seconds, for every engine call but the events stream
# Engine calls of removals at once (Config.engine_concurrency), over every removal job of
# the process; docs/benchmarks.md has the figures.
CONCURRENCY = 16
BACKOFF_MIN, BACKOFF_MAX = 0.1, 5.0  # seconds between reconnects to the events stream
# The engine answers an events request before it subscribes, so a subscription asks for a
# replay from just before it was requested. The engine is local: its clock is ours.
SINCE_MARGIN_NS = 100_000_000


def _container(cid: str, name: str, project: str | None) -> dict[str, Any]:
    """What an Outcome says of one container: the words for people, and the audit's ids."""
    extra = {"id": cid, "project": project}
    return {"what": f"container {cid[:12]} ({name})", "kind": KIND, "extra": extra}


def _owner(cid: str, name: str, labels: dict[str, str], then: str) -> Owner | None:
    """The owner a container's label names; None, and one warning, when it is malformed."""
    try:
        return Owner.parse(labels.get(LABEL_OWNER, ""))
    except OwnerError as err:
        log.warning("container %s (%s): label %s: %s; %s", name, cid[:12], LABEL_OWNER, err, then)
        return None


def _labelled(listed: dict[str, Any], owner: Owner) -> bool:
    """Whether a listed container carries `owner`'s label (kept or not)."""
    try:
        return Owner.parse((listed.get("Labels") or {}).get(LABEL_OWNER, "")) == owner
    except OwnerError:
        return False


def _resource(cid: str, name: str, labels: dict[str, str]) -> Resource | None:
    """The Resource for one labelled container; None when it is kept or its label is bad."""
    owner = None if kept(labels) else _owner(cid, name, labels, "skipped")
    if owner is None:
        return None
    project = labels.get(LABEL_COMPOSE_PROJECT) or None
    about = str(labels.get(LABEL_OWNER_NAME, ""))
    return Resource(KIND, cid, owner, name, project, owner_name=about)


def _snapshot(engine: Engine) -> Snapshot:
    listed = engine.each_container(LABEL_OWNER)
    found = (_resource(c["Id"], name_of(c), c.get("Labels") or {}) for c in listed)
    return Snapshot(KIND, tuple(r for r in found if r is not None))


class Containers(ResourceKind):
    """Containers labelled `exitwatch.owner`; those labelled `exitwatch.keep=true` are exempt.

    Health for status, written by the watching thread: `connected` (following the events
    stream now), `reconnects` (times it was followed again after being lost) and `last_error`
    (why it was last lost, or None).
    """

    kind = KIND

    def __init__(
        self, host: str | None = None, timeout: float = TIMEOUT, concurrency: int = CONCURRENCY
    ) -> None:
        # Without a host, like the docker CLI: DOCKER_HOST, or the default socket.
        self.host: str = host or os.environ.get("DOCKER_HOST", "").strip() or DEFAULT_HOST
        self._socket = socket_path(self.host)
        self._timeout = timeout
        # One bound on the engine for every removal job at once: a dead owner with 1,000
        # containers, or 100 dead owners, send `concurrency` requests, not jobs x threads.
        self._engine = Engine(self._socket, timeout, concurrency)
        self._removers = ThreadPoolExecutor(concurrency, thread_name_prefix="exitwatch-rm")
        self.connected = False
        self.reconnects = 0
        self.last_error: str | None = None
        self._since: str | None = None
        self._followed = self._down = False
        self._lock = threading.Lock()
        self._stream: Events | None = None
        # The boot time (compose.boot_time) as it was when each owner was first seen: a
        # clock stepped since then is told by it (compose.started_at).
        self._seen: dict[Owner, float] = {}
        self._discovery = Discovery(
            "docker events thread", "exitwatch-docker-events", wake=self._close_stream
        )

    def health(self) -> dict:
        return {
            "endpoint": self.host,
            "connected": self.connected,
            "reconnects": self.reconnects,
            "last_error": self.last_error,
        }

    def scan_health(self, error: EngineError | None) -> dict:
        if error is None:
            return {"endpoint": self.host, "connected": True}
        return {"endpoint": self.host, "connected": False, "last_error": str(error)}

    def ping(self) -> str | None:
        """None when the engine answers; otherwise one line naming it and saying why not."""
        try:
            self._engine.ping()
        except ENGINE_ERRORS as err:
            return f"no Docker engine answers at {self.host}: {engine_error(err)}"
        return None

    def scan(self) -> Snapshot:
        """Every labelled container now. Raises EngineError when the engine does not answer."""
        try:
            return self._sighted(_snapshot(self._engine))
        except ENGINE_ERRORS as err:
            raise EngineError(f"docker engine at {self.host}: {engine_error(err)}") from err

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
        self.connected = False

    def _close_stream(self) -> None:
        with self._lock:
            stream, self._stream = self._stream, None
        if stream is not None:
            try:
                stream.close()
            except ENGINE_ERRORS as err:
                log.debug("closing the docker events stream: %s", engine_error(err))

    def _watch(self, notify: Notify, stop_fd: int) -> None:
        delay = BACKOFF_MIN
        while not stopped(stop_fd):
            # An Engine per connection: it asks the API version of the engine that answers now,
            # and a stream stuck on a dead engine holds nothing that removals need.
            engine = Engine(self._socket, self._timeout)
            try:
                self._follow(engine, notify, stop_fd)
                problem = "the events stream ended"
            except Exception as err:
                # Closing the stream under the reader makes it raise whatever it likes.
                if stopped(stop_fd):
                    break
                if isinstance(err, ENGINE_ERRORS):
                    problem = engine_error(err)
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

    def _follow(self, engine: Engine, notify: Notify, stop_fd: int) -> None:
        """Subscribe first, then report a Snapshot, then each event until the stream ends."""
        since = self._since or _ns_time(time.time_ns() - SINCE_MARGIN_NS)
        stream = engine.events(since)
        with self._lock:
            # A stop asked for before the stream was kept here found none to close.
            if stopped(stop_fd):
                stream.close()
                return
            self._stream = stream
        notify(self._sighted(_snapshot(engine)))
        if self._followed:
            self.reconnects += 1
        if self._down:
            log.info("docker engine at %s answers again; following its events", self.host)
        self._followed, self._down, self.connected = True, False, True
        for event in stream:
            if isinstance(event, dict):
                self._on_event(event, notify)

    def _on_event(self, event: dict[str, Any], notify: Notify) -> None:
        nano = event.get("timeNano")
        if isinstance(nano, int):
            # Resume just after it: `since` includes events of that very nanosecond.
            self._since = _ns_time(nano + 1)
        actor = event.get("Actor") or {}
        cid, labels = actor.get("ID"), actor.get("Attributes") or {}
        if not cid or kept(labels):
            return
        if event.get("Action") == "destroy":
            notify(Gone(self.kind, cid))
        elif event.get("Action") == "create":
            r = _resource(cid, labels.get("name", ""), labels)
            if r is not None:
                with self._lock:
                    self._seen.setdefault(r.owner, compose.boot_time())
                notify(Found(r))

    # -- removal -------------------------------------------------------------------------------

    def refused(self, res: Resource, why: str) -> Outcome:
        return Outcome.refusal(why=why, key=res.key, **_container(res.key, res.name, res.group))

    def remove(
        self, owner: Owner, resources: list[Resource], dry_run: bool, how: str
    ) -> list[Outcome]:
        """Compose projects go as a whole (see _plan_project); networks and volumes once no
        container uses them (networks.py)."""
        outcomes = [
            self.refused(r, f"owned by {r.owner}, not {owner}")
            for r in resources
            if r.owner != owner
        ]
        mine = [r for r in resources if r.owner == owner]
        # id -> (name, project): everything that goes, decided before anything is removed.
        doomed: dict[str, tuple[str, str | None]] = {
            r.key: (r.name, None) for r in mine if r.group is None
        }
        whole = []
        projects = sorted({r.group for r in mine if r.group is not None})
        for project in projects:
            given = [r for r in mine if r.group == project]
            targets, is_whole, said = self._plan_project(owner, project, given)
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

        if doomed:
            outcomes += self._removers.map(one, doomed.items())
        since = compose.started_at(owner, self._seen_boot(owner))
        for project in whole:
            outcomes += networks.of_project(self._engine, project, since, dry_run)
        held = {p for p in projects if p not in whole}
        return outcomes + networks.labelled(self._engine, owner, dry_run, outcomes, held)

    def _plan_project(
        self, owner: Owner, project: str, given: list[Resource]
    ) -> tuple[dict[str, str], bool, list[Outcome]]:
        """Which containers of `project` go ({id: name}), whether it goes as a whole, and what
        to report. From a fresh listing of the whole project: a runner may have recreated a
        container without its labels, or a live runner may have joined the project."""
        try:
            listed = self._engine.containers(f"{LABEL_COMPOSE_PROJECT}={project}")
        except ENGINE_ERRORS as err:
            why = f"listing compose project {project}: {engine_error(err)}"
            failed = [
                Outcome.failed(detail=why, **_container(r.key, r.name, project)) for r in given
            ]
            return {}, False, failed
        why_dead = functools.cache(death)
        holders: list[str] = []  # why the project cannot go as a whole
        dead_held = False
        own: dict[str, str] = {}
        rest: dict[str, str] = {}
        for c in listed:
            cid, name, labels = c["Id"], name_of(c), c.get("Labels") or {}
            o = None
            if LABEL_OWNER in labels:
                o = _owner(cid, name, labels, f"compose project {project} is not proven dead")
                if o is None:
                    holders.append(f"{name} has an unreadable owner label")
            if o is not None and o != owner and why_dead(o) is None:
                holders.append(f"{name} is held by live owner {o}")
            elif o is not None:
                dead_held = True
            if not kept(labels):
                (own if o == owner else rest)[cid] = name
        said = [
            Outcome.done(detail="already gone", **_container(r.key, r.name, project))
            for r in given
            if r.key not in own
        ]
        if not listed:
            # Nothing is left to hold it: a retry after its networks failed to go finds them.
            return {}, True, said
        if holders:
            why = "not removed as a whole: " + "; ".join(holders)
            said.append(Outcome.refusal(f"compose project {project}", "project", why))
        # A project goes as a whole when a dead owner holds some of it and no live one any.
        if holders or not dead_held:
            return own, False, said
        joined, refused = self._unlabelled(owner, project, listed, rest)
        if refused:
            names = ", ".join(o.what for o in refused)
            why = f"not removed as a whole, networks included: {names} stay"
            refused.append(Outcome.refusal(f"compose project {project}", "project", why))
        return own | joined, not refused, said + refused

    def _unlabelled(
        self, owner: Owner, project: str, listed: list[dict[str, Any]], rest: dict[str, str]
    ) -> tuple[dict[str, str], list[Outcome]]:
        """Which of `rest` go with the owner's project ({id: name}), and a refusal for each
        unlabelled one not proven to be of the owner's instance of it (compose.py)."""
        since = compose.started_at(owner, self._seen_boot(owner))
        owned = [compose.instance(c.get("Labels") or {}) for c in listed if _labelled(c, owner)]
        joined, refused = {}, []
        for c in listed:
            cid, labels = c["Id"], c.get("Labels") or {}
            if cid not in rest:
                continue
            why = None
            if LABEL_OWNER not in labels:  # labelled ones are their own owners' business
                why = compose.why_not_ours(labels, owned)
                if why is None:
                    try:
                        info = self._engine.inspect(cid)
                    except ENGINE_ERRORS as err:
                        why = f"its creation time cannot be read: {engine_error(err)}"
                    else:
                        why = compose.why_started_before(info.get("State"), owner)
                        why = why or compose.why_older(info.get("Created"), since)
            if why is None:
                joined[cid] = rest[cid]
            else:
                what = f"not removed with compose project {project}: {why}"
                refused.append(Outcome.refusal(why=what, **_container(cid, rest[cid], project)))
        return joined, refused

    # -- what an ended run holds: networks and volumes are labelled as containers are ------

    def owned(self, owner: Owner) -> list[Resource]:
        """The containers labelled with `owner` now. Raises EngineError."""
        try:
            listed = self._engine.containers(f"{LABEL_OWNER}={owner}")
        except ENGINE_ERRORS as err:
            raise EngineError(f"docker engine at {self.host}: {engine_error(err)}") from err
        found = (_resource(c["Id"], name_of(c), c.get("Labels") or {}) for c in listed)
        return [r for r in found if r is not None and r.owner == owner]


def _ns_time(ns: int) -> str:
    """A `since` the engine reads to the nanosecond."""
    return f"{ns // 1_000_000_000}.{ns % 1_000_000_000:09d}"
