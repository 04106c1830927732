"""The engine as its users see it: exactly the calls each makes, as Ryuk's dockerClient
lists the reaper's, so that a test can put a fake in its place (tests/support/fakeengine.py).
client.Client is the docker kind's, oneshot.OneShot the labelling proxy's.

What a call raises: errors.NotFound for a 404, errors.EngineRefused for any other status
but a 2xx (a redirect too: nothing was done), OSError when no engine answers, or answers
in something other than HTTP; ValueError for an answer that is not the JSON it should be.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Protocol

from exitwatch.engine.url import Endpoint


class Events(Protocol):
    """The events stream: each event a decoded object. close() may come from another
    thread, and ends the iteration."""

    def __iter__(self) -> Iterator[Any]: ...

    def close(self) -> None: ...


class Engine(Protocol):
    """The docker kind's calls (kinds/docker). Each listing's `label` is the engine's label
    filter: `key` or `key=value`."""

    def ping(self) -> None: ...

    def containers(self, label: str) -> list[dict[str, Any]]:
        """Every container with `label`, running or not, as the engine lists them."""
        ...

    def each_container(self, label: str) -> Iterator[dict[str, Any]]:
        """containers(label), one at a time as the listing arrives."""
        ...

    def events(self, since: str, types: tuple[str, ...]) -> Events:
        """Create and destroy events of the `types` ("container", "volume", "network"),
        from `since` (seconds since the epoch, to the ns) on; a destroy's action is
        "destroy", or podman's "remove". Not filtered by label: the
        engine's label filter reads an event's attributes, and those of a volume or a
        network carry no labels (a container's carry all of its own)."""
        ...

    def inspect(self, cid: str) -> dict[str, Any]:
        """What the engine says of one container (`Created`: RFC 3339; `State`)."""
        ...

    def remove_container(self, cid: str) -> None:
        """Remove it, running or not, with its anonymous volumes."""
        ...

    def networks(self, label: str) -> list[dict[str, Any]]: ...

    def network(self, nid: str) -> dict[str, Any]:
        """What the engine says of one network (`Name`, `Labels`, `Created`)."""
        ...

    def users(self, kind: str, ident: str) -> list[dict[str, Any]]:
        """Every container, of any owner or none, running or not, that uses network or
        volume `ident` (`kind` is "network" or "volume")."""
        ...

    def remove_network(self, nid: str) -> None: ...

    def volumes(self, label: str) -> list[dict[str, Any]]: ...

    def volume(self, name: str) -> dict[str, Any]:
        """What the engine says of one volume (`Name`, `Labels`)."""
        ...

    def remove_volume(self, name: str) -> None: ...

    def network_events(self) -> bool:
        """Whether events() tells of networks made and removed (podman 4.3's does not)."""
        ...

    def pods(self, label: str) -> list[dict[str, Any]]:
        """Podman's pods with `label` (`Id`, `Name`, `Labels`); none on another engine."""
        ...

    def remove_pod(self, pid: str) -> None:
        """Remove a pod of podman's with its containers, running or not."""
        ...

    def close(self) -> None:
        """Forget what was learnt of the engine (its API version): the next call asks the
        engine that answers then."""
        ...


class Connect(Protocol):
    """What makes a client of the engine at an endpoint: client.Client, or a fake. At most
    `concurrency` of its calls are under way at once (0: no bound)."""

    def __call__(self, endpoint: Endpoint, timeout: float, concurrency: int) -> Engine: ...


class Proxying(Protocol):
    """The labelling proxy's own calls (proxy/, adopt/), unversioned, one connection each."""

    def create_volume(
        self, name: str, labels: Mapping[str, str], driver: str, options: Mapping[str, str]
    ) -> None:
        """Create a volume unless it exists (the engine then returns it untouched)."""
        ...

    def inspect(self, cid: str) -> Any:
        """What the engine says of one container: a JSON document, to be checked (the
        proxy's caller reads an engine's answer as untrusted input)."""
        ...
