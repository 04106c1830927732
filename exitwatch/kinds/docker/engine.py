"""The Docker engine as exitwatch uses it: exactly the calls it makes, on one client, and
one line for whatever the engine or the way to it says went wrong."""

from __future__ import annotations

import codecs
import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import docker
from docker.errors import APIError, DockerException, NotFound
from requests import RequestException
from urllib3.exceptions import HTTPError

from exitwatch.contract import LABEL_OWNER
from exitwatch.kinds.docker import unixhttp

DEFAULT_HOST = "unix:///var/run/docker.sock"
# Read size for the container listing: some twenty containers' worth at a time, so its
# decoding never holds much more than one chunk and the item being built.
LISTING_CHUNK = 64 * 1024
# What the engine, or the connection to it, can raise (ValueError: a garbled JSON stream).
ENGINE_ERRORS = (DockerException, RequestException, HTTPError, OSError, ValueError)
ATTEMPTS = 3  # per removal; the pause between attempts doubles from RETRY_PAUSE
RETRY_PAUSE = 0.2


class EngineError(Exception):
    """The Docker engine did not answer, or refused. The message is one line naming it."""


def engine_error(err: BaseException) -> str:
    """One line saying what went wrong, from under the layers requests and urllib3 wrap."""
    if isinstance(err, APIError):
        return f"{err.explanation or err} (HTTP {err.status_code})"
    todo: list[BaseException] = [err]
    while todo:
        cur = todo.pop(0)
        if isinstance(cur, OSError) and cur.strerror:
            return cur.strerror
        todo += [a for a in cur.args if isinstance(a, BaseException)]
        todo += [e for e in (cur.__cause__, cur.__context__) if e is not None]
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def attempt(call: Callable[[], None], again: tuple[int, ...] = (409,)) -> tuple[bool, str]:
    """Run one removal a bounded number of times: (done, "removed" / "already gone" / why not).
    A client error ends it at once, but for the statuses in `again`."""
    problem = ""
    for n in range(ATTEMPTS):
        try:
            call()
            return True, "removed"
        except NotFound:
            return True, "already gone"
        except ENGINE_ERRORS as err:
            problem = engine_error(err)
            # A refusal stays a refusal; 409 is mostly "removal already in progress".
            if isinstance(err, APIError) and err.is_client_error() and err.status_code not in again:
                break
        if n + 1 < ATTEMPTS:
            time.sleep(RETRY_PAUSE * 2**n)
    return False, problem


def name_of(listed: dict[str, Any]) -> str:
    """The name of a container as the engine lists it."""
    return (listed.get("Names") or [""])[0].lstrip("/")


class Engine:
    """Exactly the Docker calls exitwatch makes, on one client (Ryuk's narrow interface).

    The client is made on first use: making it asks the engine for its API version, which
    fails while no engine answers, and the next call should simply try again. With
    `concurrency`, at most that many of its calls (but ping and the events stream) are
    sent at once, from however many threads: the rest wait their turn.
    """

    def __init__(
        self, client_args: dict[str, Any], timeout: float, pool: int, concurrency: int = 0
    ) -> None:
        self._args, self._timeout, self._pool = client_args, timeout, pool
        self._api: docker.APIClient | None = None
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(concurrency) if concurrency else None
        base = client_args.get("base_url") or DEFAULT_HOST
        # Removals go straight to a local engine's socket (unixhttp.py says why).
        self._socket = (
            "/" + base[len("unix://") :].lstrip("/") if base.startswith("unix://") else None
        )

    def _client(self) -> docker.APIClient:
        with self._lock:
            if self._api is None:
                self._api = docker.APIClient(
                    version="auto", timeout=self._timeout, max_pool_size=self._pool, **self._args
                )
            return self._api

    @contextlib.contextmanager
    def _slot(self) -> Iterator[None]:
        if self._slots is None:
            yield
            return
        with self._slots:
            yield

    def ping(self) -> None:
        self._client().ping()

    def containers(self, label: str) -> list[dict[str, Any]]:
        return list(self.each_container(label))

    def each_container(self, label: str) -> Iterator[dict[str, Any]]:
        """The containers with `label`, decoded one at a time as the listing streams in. A
        host with thousands would otherwise hold the whole listing at once, as text and as
        objects, and the process would keep that high-water mark for good."""
        with self._slot():
            api = self._client()
            params = {"all": 1, "filters": json.dumps({"label": [label]})}
            response = api._get(api._url("/containers/json"), params=params, stream=True)
            try:
                api._raise_for_status(response)
                yield from json_array(response.iter_content(LISTING_CHUNK))
            finally:
                response.close()

    def events(self, since: str) -> Any:
        """Create and destroy events of labelled containers, as a closable iterator."""
        filters = {"type": "container", "label": LABEL_OWNER, "event": ["create", "destroy"]}
        return self._client().events(since=since, filters=filters, decode=True)

    def inspect(self, cid: str) -> dict[str, Any]:
        """What the engine says of one container (`Created`: RFC 3339, to the ns; `State`)."""
        with self._slot():
            return self._client().inspect_container(cid)

    def remove_container(self, cid: str) -> None:
        with self._slot():
            api = self._client()
            if self._socket is None:
                api.remove_container(cid, force=True, v=True)
            else:
                unixhttp.remove_container(self._socket, api.api_version, cid, self._timeout)

    def networks(self, label: str) -> list[dict[str, Any]]:
        with self._slot():
            return self._client().networks(filters={"label": label})

    def users(self, kind: str, ident: str) -> list[dict[str, Any]]:
        """Every container, of any owner or none, running or not, that uses network or
        volume `ident` (`kind` is "network" or "volume")."""
        with self._slot():
            return self._client().containers(all=True, filters={kind: ident})

    def remove_network(self, nid: str) -> None:
        with self._slot():
            self._client().remove_network(nid)

    def volumes(self, label: str) -> list[dict[str, Any]]:
        with self._slot():
            return self._client().volumes(filters={"label": label}).get("Volumes") or []

    def remove_volume(self, name: str) -> None:
        with self._slot():
            self._client().remove_volume(name)

    def close(self) -> None:
        with self._lock:
            if self._api is not None:
                self._api.close()
                self._api = None


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
                break  # not whole yet
            yield item
        buf = buf[pos:]
    raise ValueError(f"the listing ended before its closing bracket: {buf[:80]!r}")
