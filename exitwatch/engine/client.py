"""The Docker engine's calls as the docker kind makes them, over http.py: the engine's own
API version, label-filtered listings (streamed), the events stream, removals."""

from __future__ import annotations

import codecs
import contextlib
import http.client
import json
import re
import threading
from collections.abc import Iterable, Iterator
from typing import Any
from urllib.parse import quote, urlencode

from exitwatch.engine.errors import EngineRefused
from exitwatch.engine.http import Stream, answer, request
from exitwatch.engine.url import Endpoint

# Read size for the container listing: some twenty containers' worth at a time, so its
# decoding never holds much more than one chunk and the item being built.
LISTING_CHUNK = 64 * 1024
# The longest entry of a listing taken (one container, with its labels): an engine that is
# not root's may send anything (http.py's bounds).
MAX_ENTRY = 1 << 20
# What the engine, or the connection to it, can raise (ValueError: an answer that is not
# the JSON it should be).
ENGINE_ERRORS = (EngineRefused, http.client.HTTPException, OSError, ValueError)
_API_VERSION = re.compile(r"[0-9]+\.[0-9]+")
# Podman's own API, for its pods: 4.0.0 is the oldest level that 4.x and 5.x serve.
LIBPOD = "/v4.0.0/libpod"
LIBPOD_HEADER = "Libpod-API-Version"  # a header of podman's every answer: the engine is podman


def _filters(**values: str | list[str]) -> str:
    """The engine's `filters` parameter: each key's values as a list."""
    return json.dumps({k: [v] if isinstance(v, str) else v for k, v in values.items()})


class Client:
    """Exactly the Docker calls the docker kind makes (api.Engine; Ryuk's narrow interface),
    on the engine at `endpoint`, spoken by http.py.

    The API version is the engine's own, asked for on first use (as docker-py's "auto"
    did): none is kept while no engine answers, and the next call simply asks again. With
    `concurrency`, at most that many of its calls (but ping and the events stream) are
    sent at once, from however many threads: the rest wait their turn.
    """

    def __init__(self, endpoint: Endpoint, timeout: float, concurrency: int = 0) -> None:
        self._endpoint, self._timeout = endpoint, timeout
        self._version: str | None = None
        self._podman = False  # by its /_ping's Libpod-API-Version header
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(concurrency) if concurrency else None

    def _url(self, route: str, **params: Any) -> str:
        with self._lock:
            version = self._version
        if version is None:
            version, podman = self._ask_version()
            with self._lock:
                self._version, self._podman = version, podman
        query = f"?{urlencode(params)}" if params else ""
        return f"/v{version}{route}{query}"

    def _ask_version(self) -> tuple[str, bool]:
        """The engine's API version: the Api-Version header of its /_ping, else /version's
        ApiVersion. podman 4.3 takes 0.4 to 0.6 s to answer /version (it asks conmon and
        the OCI runtime for theirs), and the first removal after every (re)connect waited
        for it; its /_ping, like Docker's, says the version at once. And whether the engine
        is podman: every answer of podman's (4.x, 5.x) carries a Libpod-API-Version."""
        headers, _ = answer(self._endpoint, "GET", "/_ping", self._timeout)
        podman = headers.get(LIBPOD_HEADER) is not None
        version: Any = headers.get("Api-Version")
        if version is None:
            doc = json.loads(request(self._endpoint, "GET", "/version", self._timeout))
            version = doc.get("ApiVersion") if isinstance(doc, dict) else None
        if not isinstance(version, str) or not _API_VERSION.fullmatch(version):
            raise ValueError(f"the engine gave no API version: {version!r}")
        return version, podman

    def _get(self, route: str, **params: Any) -> Any:
        with self._slot():
            url = self._url(route, **params)
            return json.loads(request(self._endpoint, "GET", url, self._timeout))

    def _delete(self, route: str, **params: Any) -> None:
        with self._slot():
            request(self._endpoint, "DELETE", self._url(route, **params), self._timeout)

    @contextlib.contextmanager
    def _slot(self) -> Iterator[None]:
        if self._slots is None:
            yield
            return
        with self._slots:
            yield

    def ping(self) -> None:
        request(self._endpoint, "GET", "/_ping", self._timeout)

    def containers(self, label: str) -> list[dict[str, Any]]:
        return list(self.each_container(label))

    def each_container(self, label: str) -> Iterator[dict[str, Any]]:
        """The containers with `label`, decoded one at a time as the listing streams in. A
        host with thousands would otherwise hold the whole listing at once, as text and as
        objects, and the process would keep that high-water mark for good."""
        with self._slot():
            url = self._url("/containers/json", all=1, filters=_filters(label=label))
            stream = Stream(self._endpoint, url, self._timeout)
            try:
                yield from json_array(stream.chunks(LISTING_CHUNK))
            finally:
                stream.close()

    def events(self, since: str, types: tuple[str, ...]) -> Events:
        """Create and destroy events of the `types`, from `since` on (no label filter: a
        volume's or network's events carry no labels for it to match, and podman 4.3
        answers one without a value with no event at all). podman's destroy is "remove"."""
        filters = _filters(type=list(types), event=["create", "destroy", "remove"])
        url = self._url("/events", since=since, filters=filters)
        return Events(Stream(self._endpoint, url, self._timeout, endless=True))

    def inspect(self, cid: str) -> dict[str, Any]:
        """What the engine says of one container (`Created`: RFC 3339, to the ns; `State`)."""
        return self._get(f"/containers/{quote(cid, safe='')}/json")

    def remove_container(self, cid: str) -> None:
        """Remove it, running or not, with its anonymous volumes. On podman, SIGKILLed
        first: podman 5's forced removal stops a container with its stop timeout (10 s for
        a pid 1 that ignores SIGTERM), where Docker's and podman 4.3's kill at once."""
        route = f"/containers/{quote(cid, safe='')}"
        with self._slot():
            url = self._url(route, force=1, v=1)
            with self._lock:
                podman = self._podman
            if podman:
                # Not running, or gone: the removal's own answer says what that means.
                with contextlib.suppress(EngineRefused):
                    kill = self._url(f"{route}/kill", signal="KILL")
                    request(self._endpoint, "POST", kill, self._timeout)
            request(self._endpoint, "DELETE", url, self._timeout)

    def networks(self, label: str) -> list[dict[str, Any]]:
        return self._get("/networks", filters=_filters(label=label))

    def network(self, nid: str) -> dict[str, Any]:
        return self._get(f"/networks/{quote(nid, safe='')}")

    def users(self, kind: str, ident: str) -> list[dict[str, Any]]:
        """Every container, of any owner or none, running or not, that uses network or
        volume `ident` (`kind` is "network" or "volume")."""
        return self._get("/containers/json", all=1, filters=_filters(**{kind: ident}))

    def remove_network(self, nid: str) -> None:
        self._delete(f"/networks/{quote(nid, safe='')}")

    def volumes(self, label: str) -> list[dict[str, Any]]:
        return self._get("/volumes", filters=_filters(label=label)).get("Volumes") or []

    def volume(self, name: str) -> dict[str, Any]:
        return self._get(f"/volumes/{quote(name, safe='')}")

    def remove_volume(self, name: str) -> None:
        self._delete(f"/volumes/{quote(name, safe='')}")

    def network_events(self) -> bool:
        """Whether the engine tells of networks made and removed in its events stream:
        podman 4.3 does not (docs/podman.md). Asks the engine its version first."""
        self._url("")
        with self._lock:
            return not self._podman

    def pods(self, label: str) -> list[dict[str, Any]]:
        """Podman's pods with `label` (`Id`, `Name`, `Labels`); none where the engine is not
        podman, which has no pods."""
        with self._slot():
            self._url("/_ping")  # learns which engine it is
            with self._lock:
                if not self._podman:
                    return []
            url = f"{LIBPOD}/pods/json?{urlencode({'filters': _filters(label=label)})}"
            return json.loads(request(self._endpoint, "GET", url, self._timeout)) or []

    def remove_pod(self, pid: str) -> None:
        """Remove a pod of podman's with its containers, running or not."""
        with self._slot():
            url = f"{LIBPOD}/pods/{quote(pid, safe='')}?force=true"
            request(self._endpoint, "DELETE", url, self._timeout)

    def close(self) -> None:
        """Forget the API version: the next call asks the engine that answers then."""
        with self._lock:
            self._version = None


class Events:
    """The events stream, each event a decoded object; close() may come from another thread,
    and ends the iteration."""

    def __init__(self, stream: Stream) -> None:
        self._stream = stream
        self._objects = stream.objects()

    def __iter__(self) -> Iterator[Any]:
        return self._objects

    def close(self) -> None:
        self._stream.close()


def json_array(chunks: Iterable[bytes]) -> Iterator[dict[str, Any]]:
    """The objects of a JSON array of objects arriving in chunks, each as soon as it is
    whole. Raises ValueError for anything else, or for a listing cut short."""
    decoder = json.JSONDecoder()
    text = codecs.getincrementaldecoder("utf-8")()
    buf, opened = "", False
    for chunk in chunks:
        buf += text.decode(chunk)
        pos = 0
        while True:
            while pos < len(buf) and buf[pos] in ", \t\r\n":
                pos += 1
            if pos == len(buf):
                break
            if not opened:
                if buf[pos] != "[":
                    raise ValueError(f"the listing is not a JSON array: {buf[pos:][:80]!r}")
                opened, pos = True, pos + 1
                continue
            if buf[pos] == "]":
                return
            if buf[pos] != "{":
                raise ValueError(f"the listing holds a non-object: {buf[pos:][:80]!r}")
            try:
                item, pos = decoder.raw_decode(buf, pos)
            except json.JSONDecodeError:
                if len(buf) - pos > MAX_ENTRY:
                    raise ValueError(
                        f"the listing holds an entry over {MAX_ENTRY >> 20} MiB"
                    ) from None
                break  # not whole yet
            yield item
        buf = buf[pos:]
    raise ValueError(f"the listing ended before its closing bracket: {buf[:80]!r}")
