"""What the container kind declares of itself (kinds/registry.py): its `[containers]`
settings, its health line, what an owner holds of it in status, and its metrics."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from exitwatch.engine import url
from exitwatch.kinds.base import Metric, Part, Registration, Resource
from exitwatch.kinds.docker.kind import CONCURRENCY, CONFIGURED, KIND, Containers
from exitwatch.kinds.docker.labels import NETWORK, VOLUME, engine_of, split


@dataclass(frozen=True)
class Settings:
    """The `[containers]` table."""

    enabled: bool = True
    """Reap the containers, networks and volumes labelled with a dead owner, with their
    compose projects' networks and volumes."""
    docker_host: str | None = None
    """The local engine's socket, a unix:// URL: Docker's, or podman's Docker API; unset:
    DOCKER_HOST, or the default socket (exitwatch/engine/url.py has the rules). The
    one-engine spelling of `engines`."""
    engines: tuple[str, ...] = ()
    """The engines followed, each a unix:// URL, in place of `docker_host` (not with it)."""
    find_engines: bool = True
    """Also follow every engine found on the host, as it appears: root's podman
    (/run/podman/podman.sock), and each user's rootless Docker (/run/user/UID/docker.sock)
    and rootless podman (/run/user/UID/podman/podman.sock). A user's socket is followed only
    while it is that user's own, reached through no symlink; what such an engine answers is
    read as untrusted input."""
    concurrency: int = CONCURRENCY
    """At most this many requests to each engine are under way at once for removals (of
    containers, their networks and volumes, and the listings they need), over every
    removal of the process: a dead owner with 1,000 containers, or many dead owners at
    once, wait their turn rather than flood the engine."""

    def checks(self) -> dict[str, tuple[bool, str]]:
        return {
            "docker_host": (self.docker_host is None or url.valid(self.docker_host), url.EXPECTED),
            "engines": (
                all(url.valid(u) for u in self.engines) and not (self.engines and self.docker_host),
                f"a list of URLs, each {url.EXPECTED}; and not beside docker_host (one or "
                "the other)",
            ),
            "concurrency": (1 <= self.concurrency <= 256, "an integer in 1..256"),
        }


def _make(settings: Settings) -> Containers:
    """Raises ValueError for an engine that is not a local socket (DOCKER_HOST may name
    one): owners of another host carry another boot id, which reads as "rebooted"."""
    try:
        return Containers(
            settings.docker_host,
            concurrency=settings.concurrency,
            engines=tuple(settings.engines),
            find=settings.find_engines,
        )
    except url.EndpointError as err:
        raise ValueError(f"docker_host: {err}") from None


def _state(engine: dict) -> str:
    state = "connected" if engine.get("connected") else f"DOWN ({engine.get('last_error')})"
    return state + (f", {engine['reconnects']} reconnects" if engine.get("reconnects") else "")


def _health_lines(docker: dict) -> list[str]:
    engines = docker.get("engines") or [docker]
    if len(engines) == 1:
        return [f"  docker:   {engines[0].get('endpoint')}: {_state(engines[0])}"]
    lines = [f"  docker:   {len(engines)} engines"]
    for e in engines:
        held = f", holds {e['resources']}" if e.get("resources") else ""
        lines.append(f"    {e.get('endpoint')} ({e.get('how', CONFIGURED)}): {_state(e)}{held}")
    return lines


def _of(type_: str) -> Callable[[Resource], bool]:
    return lambda res: split(res.key)[0] == type_


def _networks(held: list[Resource]) -> list[dict]:
    return [
        {"id": split(r.key)[1], "name": r.name.removeprefix("network "), "project": r.group}
        | _engine(r)
        for r in sorted(held, key=lambda r: r.name)
    ]


def _volumes(held: list[Resource]) -> list[dict]:
    return [
        {"name": split(r.key)[1], "project": r.group} | _engine(r)
        for r in sorted(held, key=lambda r: r.name)
    ]


def _engine(res: Resource) -> dict:
    """Which engine holds it, as a URL."""
    where = engine_of(res.key)
    return {"engine": url.served(where)} if where else {}


def _lines(type_: str) -> Callable[[list], list[str]]:
    def lines(held: list) -> list[str]:
        return [
            f"    {type_} {h['name']}" + (f" (project {h['project']})" if h.get("project") else "")
            for h in held
        ]

    return lines


REGISTRATION = Registration(
    kind=KIND,
    table="containers",
    settings=Settings,
    make=_make,
    # engines and find_engines: the names of `exitwatch agent`'s and `reap`'s flags.
    aliases={
        "docker_host": "docker_host",
        "engines": "engines",
        "find_engines": "find_engines",
        "engine_concurrency": "concurrency",
    },
    health_key="docker",
    health_lines=_health_lines,
    held=lambda held: [
        {"id": split(r.key)[1], "name": r.name, "project": r.group} | _engine(r) for r in held
    ],
    held_lines=lambda held: [
        f"    container {c['id'][:12]} ({c['name']}"
        + (f", project {c['project']}" if c.get("project") else "")
        + ")"
        for c in held
    ],
    # Labelled networks and volumes are resources of the kind (one removal job takes an
    # owner's containers, then what they used); status shows them under keys of their own.
    parts=(
        Part(key="networks", has=_of(NETWORK), held=_networks, held_lines=_lines(NETWORK)),
        Part(key="volumes", has=_of(VOLUME), held=_volumes, held_lines=_lines(VOLUME)),
    ),
    # One series per engine, labelled with its URL.
    metrics=(
        Metric(
            "exitwatch_engine_reconnects_total",
            "Events stream reconnects, by engine.",
            "reconnects",
            counter=True,
            each=("engines", "endpoint", "engine"),
        ),
        Metric(
            "exitwatch_engine_connected",
            "1 while the engine answers, by engine.",
            "connected",
            each=("engines", "endpoint", "engine"),
        ),
        Metric(
            "exitwatch_engine_resources",
            "Labelled containers, networks and volumes the agent knows of, by engine.",
            "resources",
            each=("engines", "endpoint", "engine"),
        ),
    ),
)
