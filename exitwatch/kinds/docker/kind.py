"""Containers labelled with an owner, on every engine followed: those the settings name, and
(unless told not to) those found on the host as they appear (engine/host.py): root's
podman, each user's rootless Docker and podman. Each engine has a Follower of its own
(follower.py): its own thread, client and bound on requests, so that a slow, stalled or
lying engine holds up no other's listings or removals. This module routes between them.

An engine's resources are keyed with its scope (its socket's path and "|") in front of the
key its follower knows, so that two engines' volume "data" are two resources, and a
listing of one engine is the whole truth of that engine alone (Snapshot.scopes): what it
leaves out says nothing of another engine. A follower never sees a scope.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import cast

from exitwatch.engine import api
from exitwatch.engine.client import Client
from exitwatch.engine.host import Found as FoundEngine
from exitwatch.engine.host import find as find_engines
from exitwatch.engine.url import Endpoint, chosen
from exitwatch.kinds.base import (
    Change,
    Found,
    Gone,
    Notify,
    Outcome,
    Resource,
    ResourceKind,
    Snapshot,
    Unavailable,
)
from exitwatch.kinds.discovery import Discovery, stopped, wait
from exitwatch.kinds.docker.attempts import EngineError
from exitwatch.kinds.docker.follower import CONCURRENCY, TIMEOUT, EngineHealth, Follower
from exitwatch.kinds.docker.labels import KIND
from exitwatch.owner import Owner

log = logging.getLogger(__name__)

__all__ = ["CONCURRENCY", "KIND", "Containers", "DockerHealth"]

FIND_EVERY = 2.0  # seconds between looks for engines that appeared on the host
# Engines followed at most: each has a thread and a pool. A host has one runtime directory
# per logged-in user, and two engines' places in each.
MAX_ENGINES = 64
SCAN_DEADLINE = 120.0  # seconds a reconcile waits for every engine's listing
CONFIGURED = "configured"


class EngineEntry(EngineHealth, total=False):
    """An engine in the status document: its health, how it was found, and how many
    labelled containers, networks and volumes it holds that the agent knows of."""

    how: str
    resources: int


class DockerHealth(EngineHealth, total=False):
    """The status document's `docker` entry: the first engine's health at its top (what it
    showed when there was one engine), and every engine's under `engines`."""

    engines: list[EngineEntry]


def _scope(endpoint: Endpoint) -> str:
    return f"{endpoint.where}|"


class _Engine:
    """A Follower, how it was found, and what it told, keyed with its scope."""

    def __init__(self, follower: Follower, how: str) -> None:
        self.follower, self.how = follower, how
        self.scope = _scope(follower.endpoint)
        self.told: set[str] = set()  # scoped keys it reported and has not reported gone
        self.lock = threading.Lock()

    def scoped(self, res: Resource) -> Resource:
        return dataclasses.replace(res, key=self.scope + res.key)

    def unscoped(self, res: Resource) -> Resource:
        return dataclasses.replace(res, key=res.key.removeprefix(self.scope))

    def outcome(self, out: Outcome) -> Outcome:
        key = self.scope + out.key if out.key else ""
        return dataclasses.replace(out, key=key, extra={**out.extra, "engine": self.url})

    @property
    def url(self) -> str:
        return self.follower.host

    def snapshot(self, snap: Snapshot) -> Snapshot:
        resources = tuple(self.scoped(r) for r in snap.resources)
        return Snapshot(snap.kind, resources, snap.skipped, (self.scope,))

    def notify(self, notify: Notify) -> Notify:
        """`notify` as this engine's follower tells it: scoped, and counted."""

        def told(change: Change) -> None:
            if isinstance(change, Found):
                change = Found(self.scoped(change.resource))
                with self.lock:
                    self.told.add(change.resource.key)
            elif isinstance(change, Gone):
                change = Gone(change.kind, self.scope + change.key)
                with self.lock:
                    self.told.discard(change.key)
            else:
                change = self.snapshot(change)
                with self.lock:
                    self.told = {r.key for r in change.resources}
            notify(change)

        return told

    def entry(self, health: EngineHealth) -> EngineEntry:
        with self.lock:
            held = len(self.told)
        return {**health, "how": self.how, "resources": held}


class Containers(ResourceKind):
    """Containers, networks and volumes labelled `exitwatch.owner` on every engine followed;
    those labelled `exitwatch.keep=true` are exempt."""

    kind = KIND

    def __init__(
        self,
        host: str | None = None,
        timeout: float = TIMEOUT,
        concurrency: int = CONCURRENCY,
        client: api.Connect = Client,
        *,
        engines: tuple[str, ...] = (),
        find: bool = False,
        finder: Callable[[], list[FoundEngine]] = find_engines,
    ) -> None:
        """`host`: the one engine's URL (the `docker_host` setting); `engines`: several
        (the `engines` setting; not with `host`). Without either, like the docker CLI:
        DOCKER_HOST, or the default (engine/url.py). With `find`, also every engine that
        `finder` finds on the host, from start() on. Raises EndpointError for a URL that
        names no engine spoken to. `client` makes a client of an engine (a fake one, in
        tests); `concurrency` bounds each engine's requests for removals."""
        given = [Endpoint.parse(u) for u in engines] if engines else [chosen(host)]
        self._make = lambda ep: Follower(ep, timeout, concurrency, client)
        self._engines: dict[str, _Engine] = {}
        self._lock = threading.Lock()
        for endpoint in given:
            if _scope(endpoint) not in self._engines:
                self._engines[_scope(endpoint)] = _Engine(self._make(endpoint), CONFIGURED)
        first = next(iter(self._engines.values()))
        # The first engine given: what `exitwatch run` and the one-engine status show.
        self.endpoint: Endpoint = first.follower.endpoint
        self.host: str = first.url
        self._find, self._finder = find, finder
        self._notify: Notify | None = None
        self._too_many = False
        self._scan_errors: dict[str, Unavailable] = {}  # scope -> why the last scan() failed
        self._finding = Discovery("engine finder", "exitwatch-engines")
        self._jobs = ThreadPoolExecutor(MAX_ENGINES, thread_name_prefix="exitwatch-engine")

    def _all(self) -> list[_Engine]:
        with self._lock:
            return list(self._engines.values())

    def _of(self, key: str) -> _Engine | None:
        return next((e for e in self._all() if key.startswith(e.scope)), None)

    # -- health ----------------------------------------------------------------------------

    def health(self) -> DockerHealth:
        return _document([e.entry(e.follower.health()) for e in self._all()])

    def scan_health(self, error: Unavailable | None) -> DockerHealth:
        """After scan(), which raised `error` or not: each engine as it answered then."""
        return _document(
            [e.entry(e.follower.scan_health(self._scan_errors.get(e.scope))) for e in self._all()]
        )

    def ping(self) -> str | None:
        """None when every engine given answers (a found one that does not is the
        reconcile's to say); else one line per engine that does not."""
        problems = [e.follower.ping() for e in self._all() if e.how == CONFIGURED]
        said = [p for p in problems if p is not None]
        return "; ".join(said) if said else None

    # -- listing ---------------------------------------------------------------------------

    def scan(self) -> Snapshot:
        """Every labelled container, network and volume now, of each engine that answers
        within SCAN_DEADLINE, as the whole truth of those engines. Raises EngineError when
        none answers; one that does not is said in the log."""
        if self._find and self._notify is None:  # a one-shot scan: no finder thread runs
            try:
                self._found(self._finder())
            except OSError as err:
                log.warning("cannot look for the host's engines: %s; the others are listed", err)
        engines = self._all()
        futures = {e.scope: self._jobs.submit(e.follower.scan) for e in engines}
        resources: list[Resource] = []
        scopes, errors = [], {}
        for e in engines:
            try:
                snap = futures[e.scope].result(SCAN_DEADLINE)
            except Unavailable as err:
                errors[e.scope] = err
                continue
            except TimeoutError:
                errors[e.scope] = EngineError(f"docker engine at {e.url}: no listing in time")
                continue
            scoped = e.snapshot(snap)
            resources += scoped.resources
            scopes.append(e.scope)
        self._scan_errors = errors
        if not scopes:
            raise EngineError("; ".join(str(err) for err in errors.values()))
        for problem in errors.values():
            log.warning("cannot list %s; the other engines were", problem)
        return Snapshot(KIND, tuple(resources), scopes=tuple(scopes))

    def owned(self, owner: Owner) -> list[Resource]:
        """The containers labelled with `owner` now, on every engine. Raises EngineError."""
        return [e.scoped(r) for e in self._all() for r in e.follower.owned(owner)]

    # -- watching --------------------------------------------------------------------------

    def start(self, notify: Notify) -> None:
        self._notify = notify
        for e in self._all():
            e.follower.start(e.notify(notify))
        if self._find:
            self._finding.start(self._look_for_engines)

    def stop(self) -> None:
        self._finding.stop()
        for e in self._all():
            e.follower.stop()
        self._jobs.shutdown(wait=False, cancel_futures=True)

    def _look_for_engines(self, stop_fd: int) -> None:
        said = None  # the last failure to look, said once
        while not stopped(stop_fd):
            try:
                self._found(self._finder())
                said = None
            except OSError as err:  # proves nothing: the engines followed stay followed
                if str(err) != said:
                    log.warning("cannot look for the host's engines now: %s", err)
                said = str(err)
            except Exception:  # a bug: the thread must outlive it, and say so
                log.exception("engine finder: unexpected error")
            if wait(stop_fd, None, FIND_EVERY):
                return

    def _found(self, found: list[FoundEngine]) -> None:
        """Follow each engine found that is not followed yet, under one name: an engine
        given by two paths (a symlink, /var/run for /run) is followed once. Stop following
        a found one whose socket went."""
        self._lost({_scope(item.endpoint) for item in found})
        known = self._all()
        seen = {_identity(e.follower.endpoint) for e in known} - {None}
        for item in found:
            scope = _scope(item.endpoint)
            if any(e.scope == scope for e in known):
                continue
            ident = _identity(item.endpoint)
            if ident is None or ident in seen:
                continue
            if len(known) >= MAX_ENGINES:
                if not self._too_many:
                    log.warning(
                        "engine %s (%s) not followed: %d engines are, the most there may be",
                        item.endpoint,
                        item.how,
                        MAX_ENGINES,
                    )
                    self._too_many = True
                continue
            e = _Engine(self._make(item.endpoint), item.how)
            with self._lock:
                self._engines[scope] = e
            known.append(e)
            seen.add(ident)
            if self._notify is not None:
                log.info("engine found: %s (%s); following it", item.endpoint, item.how)
                e.follower.start(e.notify(self._notify))

    def _lost(self, there: set[str]) -> None:
        """A found engine whose socket is not `there` any more (its user's engine stopped,
        its user logged out) is not followed, and what the agent knew of it is forgotten:
        it cannot be removed from there now, and nothing says the engine comes back. When
        it does, it is found again, and its listing is the truth again (dead owners' things
        go then). An engine given in the settings is followed, and waited for, for good."""
        gone = [e for e in self._all() if e.how != CONFIGURED and e.scope not in there]
        for e in gone:
            with self._lock:
                del self._engines[e.scope]
            e.follower.stop()
            if self._notify is not None:
                log.info("engine gone: %s (%s); no longer followed", e.url, e.how)
                self._notify(Snapshot(KIND, (), scopes=(e.scope,)))

    # -- removal ---------------------------------------------------------------------------

    def remove(
        self, owner: Owner, resources: list[Resource], dry_run: bool, how: str
    ) -> list[Outcome]:
        """Each engine's share, on that engine's follower, the engines at once: one that
        stalls holds up no other's removals of the same owner. Only the engines that hold
        something of `resources` are asked; with none given, every engine."""
        # Nothing given: whatever of the owner each engine holds (its labelled networks and
        # volumes are looked for on each, as on one).
        shares: dict[str, tuple[_Engine, list[Resource]]] = {
            e.scope: (e, []) for e in (self._all() if not resources else ())
        }
        outcomes: list[Outcome] = []
        for res in resources:
            e = self._of(res.key)
            if e is None:  # not ours to have made; a bug if ever seen
                outcomes.append(Outcome.failed(res.name or res.key, KIND, "no engine of its"))
                continue
            shares.setdefault(e.scope, (e, []))[1].append(e.unscoped(res))

        def share(item: tuple[_Engine, list[Resource]]) -> list[Outcome]:
            e, mine = item
            return [e.outcome(o) for o in e.follower.remove(owner, mine, dry_run, how)]

        if len(shares) == 1:
            outcomes += share(next(iter(shares.values())))
        else:
            for done in self._jobs.map(share, shares.values()):
                outcomes += done
        return outcomes

    def refused(self, res: Resource, why: str) -> Outcome:
        e = self._of(res.key)
        if e is None:
            return super().refused(res, why)
        return e.outcome(e.follower.refused(e.unscoped(res), why))

    def what(self, res: Resource) -> str:
        e = self._of(res.key)
        return super().what(res) if e is None else e.follower.what(e.unscoped(res))

    def followers(self) -> Iterator[tuple[Follower, str]]:
        """Each engine's follower, with how the engine was found."""
        return ((e.follower, e.how) for e in self._all())


def _document(entries: list[EngineEntry]) -> DockerHealth:
    """The `docker` entry of every engine's: the first engine's health at its top."""
    first = entries[0]
    top = {k: v for k, v in first.items() if k in EngineHealth.__annotations__}
    return cast(DockerHealth, {**top, "engines": entries})


def _identity(endpoint: Endpoint) -> tuple[int, int] | None:
    try:
        return endpoint.identity()
    except OSError:
        return None
