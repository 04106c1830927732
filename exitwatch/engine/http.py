"""HTTP/1.1 to an engine, spoken straight over its socket with http.client: one request's
answer, or a stream read as it arrives (a listing, the events).

An SDK (docker-py, and requests and urllib3 under it) would cost each start of the agent,
`exitwatch reap` and `run`'s cleanup 0.05 to 0.07 s of CPU and 8 MB of memory, and each
call 1.6 ms of CPU against 0.23 ms here (docs/design.md, "Containers"): in a bulk reap on
a small host, that CPU is taken from dockerd itself, whose removal rate is the limit. The
calls exitwatch makes are few and plain (client.py). Each opens a connection of its own,
as the removals' DELETE always did, so that no call waits on another's socket.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

from exitwatch.engine.errors import refusal
from exitwatch.engine.url import Endpoint


class _Connection(http.client.HTTPConnection):
    """http.client's connection, over whatever the endpoint connects (url.py)."""

    def __init__(self, endpoint: Endpoint, timeout: float | None) -> None:
        super().__init__("localhost", timeout=timeout)
        self._endpoint = endpoint
        # Kept apart from `sock`, which http.client drops when an answer says "close".
        self.raw: socket.socket | None = None

    def connect(self) -> None:
        self.sock = self.raw = self._endpoint.connect(self.timeout)


def _cut_short(read: Callable[[], bytes]) -> bytes:
    """read(), with http.client's word for an answer that ended early made an OSError."""
    try:
        return read()
    except http.client.HTTPException as err:
        raise OSError(f"the engine's answer was cut short: {err!r}") from None


def _release(conn: _Connection, answer: http.client.HTTPResponse | None) -> None:
    """Close the answer, the connection and its socket. An answer that says "close" makes
    http.client forget the socket, whose descriptor the answer's reader alone then holds."""
    if answer is not None:
        answer.close()
    conn.close()
    if conn.raw is not None:
        conn.raw.close()


def _send(
    endpoint: Endpoint, method: str, url: str, timeout: float
) -> tuple[_Connection, http.client.HTTPResponse]:
    """Connect, send, and read the answer's head: the connection and the answer, with the
    socket still open. Raises EngineRefused (NotFound for a 404) for anything but a 2xx (a
    redirect too: nothing was done), OSError when no engine answers in HTTP."""
    conn = _Connection(endpoint, timeout)
    answer = None
    try:
        conn.request(method, url)
        try:
            answer = conn.getresponse()
        except http.client.HTTPException as err:
            raise OSError(f"the engine did not answer in HTTP: {err!r}") from None
        if not 200 <= answer.status < 300:
            raise refusal(answer.status, answer.reason, _cut_short(answer.read))
    except BaseException:
        _release(conn, answer)
        raise
    return conn, answer


def request(endpoint: Endpoint, method: str, url: str, timeout: float) -> bytes:
    """The whole body of one call's 2xx answer. Raises as _send does."""
    return answer(endpoint, method, url, timeout)[1]


def answer(
    endpoint: Endpoint, method: str, url: str, timeout: float
) -> tuple[http.client.HTTPMessage, bytes]:
    """The headers and the whole body of one call's 2xx answer. Raises as _send does."""
    conn, got = _send(endpoint, method, url, timeout)
    try:
        return got.headers, _cut_short(got.read)
    finally:
        _release(conn, got)


class Stream:
    """A 2xx answer read as it arrives (a listing, the events stream).

    close() may come from another thread while a read is under way: it shuts the socket
    down, which wakes that read, and the reader lets the connection go when the read
    returns (http.client's objects are not to be closed under a reader)."""

    def __init__(
        self, endpoint: Endpoint, url: str, timeout: float, *, endless: bool = False
    ) -> None:
        self._conn, self._answer = _send(endpoint, "GET", url, timeout)
        if endless and self._conn.raw is not None:  # quiet for as long as nothing happens
            self._conn.raw.settimeout(None)
        self._lock = threading.Lock()
        self._closed = self._reading = False

    def chunks(self, size: int) -> Iterator[bytes]:
        """The body, at most `size` bytes at a time, until it ends."""
        while piece := self._read(lambda: self._answer.read1(size)):
            yield piece

    def objects(self) -> Iterator[Any]:
        """One JSON document per line (the engine ends each event with a newline)."""
        while line := self._read(self._answer.readline):
            if line.strip():
                yield json.loads(line)

    def _read(self, read: Callable[[], bytes]) -> bytes:
        with self._lock:
            if self._closed:
                return b""
            self._reading = True
        try:
            return _cut_short(read)
        finally:
            with self._lock:
                self._reading = False
                closed = self._closed
            if closed:
                _release(self._conn, self._answer)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            reading = self._reading
            # Under the lock: a reader that wakes lets the socket go only after taking it.
            if reading and self._conn.raw is not None:
                with contextlib.suppress(OSError):
                    self._conn.raw.shutdown(socket.SHUT_RDWR)
        if not reading:
            _release(self._conn, self._answer)
