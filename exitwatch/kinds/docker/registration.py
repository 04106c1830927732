"""What the container kind declares of itself (kinds/registry.py): its `[containers]`
settings, its health line, what an owner holds of it in status, and its metrics."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from exitwatch.engine import url
from exitwatch.kinds.base import Metric, Part, Registration, Resource
from exitwatch.kinds.docker.kind import CONCURRENCY, KIND, Containers
from exitwatch.kinds.docker.labels import NETWORK, VOLUME, split


@dataclass(frozen=True)
class Settings:
    """The `[containers]` table."""

    enabled: bool = True
    """Reap the containers, networks and volumes labelled with a dead owner, with their
    compose projects' networks and volumes."""
    docker_host: str | None = None
    """The local Docker engine's socket, a unix:// URL; unset: DOCKER_HOST, or the default
    socket (exitwatch/engine/url.py has the rules)."""
    concurrency: int = CONCURRENCY
    """At most this many requests to the Docker engine are under way at once for removals
    (of containers, their networks and volumes, and the listings they need), over every
    removal of the process: a dead owner with 1,000 containers, or many dead owners at
    once, wait their turn rather than flood the engine."""

    def checks(self) -> dict[str, tuple[bool, str]]:
        return {
            "docker_host": (self.docker_host is None or url.valid(self.docker_host), url.EXPECTED),
            "concurrency": (1 <= self.concurrency <= 256, "an integer in 1..256"),
        }


def _make(settings: Settings) -> Containers:
    """Raises ValueError for an engine that is not a local socket (DOCKER_HOST may name
    one): owners of another host carry another boot id, which reads as "rebooted"."""
    try:
        return Containers(settings.docker_host, concurrency=settings.concurrency)
    except url.EndpointError as err:
        raise ValueError(f"docker_host: {err}") from None


def _health_lines(docker: dict) -> list[str]:
    state = "connected" if docker.get("connected") else f"DOWN ({docker.get('last_error')})"
    extra = f", {docker['reconnects']} reconnects" if docker.get("reconnects") else ""
    return [f"  docker:   {docker.get('endpoint')}: {state}{extra}"]


def _of(type_: str) -> Callable[[Resource], bool]:
    return lambda res: split(res.key)[0] == type_


def _networks(held: list[Resource]) -> list[dict]:
    return [
        {"id": split(r.key)[1], "name": r.name.removeprefix("network "), "project": r.group}
        for r in sorted(held, key=lambda r: r.name)
    ]


def _volumes(held: list[Resource]) -> list[dict]:
    return [
        {"name": split(r.key)[1], "project": r.group} for r in sorted(held, key=lambda r: r.name)
    ]


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
    aliases={"docker_host": "docker_host", "engine_concurrency": "concurrency"},
    health_key="docker",
    health_lines=_health_lines,
    held=lambda held: [{"id": r.key, "name": r.name, "project": r.group} for r in held],
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
    metrics=(
        Metric(
            "exitwatch_engine_reconnects_total",
            "Docker events stream reconnects.",
            "reconnects",
            counter=True,
        ),
        Metric("exitwatch_engine_connected", "1 while the Docker engine answers.", "connected"),
    ),
)
