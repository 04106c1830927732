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

# Bounds on what an engine may send, for an engine is not always root's: a user's rootless
# engine answers what its user wants, and no answer of it may take the agent's memory.
# Far above what a real one sends (a listing of 10,000 networks is some 10 MB; an event, a
# few kB with a container's labels).
MAX_ANSWER = 64 << 20  # bytes of one answer read whole
MAX_LINE = 1 << 20  # bytes of one line of a stream (an event)


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
            raise refusal(answer.status, answer.reason, _bounded(answer))
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
        return got.headers, _bounded(got)
    finally:
        _release(conn, got)


def _bounded(answer: http.client.HTTPResponse) -> bytes:
    """The whole body, if it is at most MAX_ANSWER bytes. Raises OSError."""
    over = OSError(f"the engine's answer is over {MAX_ANSWER >> 20} MiB: not read")
    if answer.length is not None:  # a Content-Length: a short body raises when read whole
        if answer.length > MAX_ANSWER:
            raise over
        return _cut_short(answer.read)
    body = _cut_short(lambda: answer.read(MAX_ANSWER + 1))  # chunked
    if len(body) > MAX_ANSWER:
        raise over
    return body


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
        """One JSON document per line (the engine ends each event with a newline), each
        at most MAX_LINE bytes: a longer one raises OSError."""
        while line := self._read(lambda: self._answer.readline(MAX_LINE + 1)):
            if len(line) > MAX_LINE:
                raise OSError(f"a line of the engine's stream is over {MAX_LINE >> 20} MiB")
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
