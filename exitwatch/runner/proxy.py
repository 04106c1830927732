"""The run's Docker socket: every connection forwarded to the caller's engine, with the run's
owner label added to creation requests.

Each client connection gets a connection of its own to the engine, so responses need no
parsing: they come back in order, byte for byte. Only requests are read, with h11, one head at a
time; bodies pass raw, except those of the few requests whose body must be read (creations, to
label them; an exec start, to know whether the engine will hijack the connection). After a
hijacking request both directions are raw bytes until each side closes its half.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import select
import socket
import threading
import time
from collections.abc import Mapping
from urllib.parse import urlsplit

import h11

from exitwatch.contract import LABEL_OWNER, kept
from exitwatch.runner import relay

log = logging.getLogger(__name__)

DEFAULT_ENGINE = "/var/run/docker.sock"
CHUNK = 64 * 1024  # bytes per read of a request
MAX_HEAD = 1024 * 1024  # X-Registry-Auth and X-Registry-Config headers can be large
MAX_BODY = 64 * 1024 * 1024  # for the bodies read whole: creations and exec starts
BACKLOG = 128
ACCEPT_PAUSE = 0.05  # seconds before accepting again after accept() failed

_API = rb"(?:/v[0-9]+(?:\.[0-9]+)*)?"
_CREATE = re.compile(_API + rb"/(?:containers|networks|volumes)/create(?:\?.*)?")
_EXEC_START = re.compile(_API + rb"/exec/[^/?]+/start(?:\?.*)?")
_ATTACH = re.compile(_API + rb"/containers/[^/?]+/attach(?:\?.*)?")


class ProxyError(Exception):
    """The run's socket cannot be set up; the message is one line."""


def engine_path(env: Mapping[str, str]) -> str:
    """The unix socket of the engine the caller would have used: DOCKER_HOST, or the default.

    Raises ProxyError for an engine that is not a unix socket: a tcp:// engine may need TLS
    that the proxy would have to terminate and speak again, and an ssh:// one a tunnel.
    """
    host = env.get("DOCKER_HOST", "").strip()
    if not host:
        return DEFAULT_ENGINE
    url = urlsplit(host)
    if url.scheme == "unix" and url.path:
        return url.path
    raise ProxyError(
        f"DOCKER_HOST={host}: only an engine on a unix socket (unix://PATH) can be proxied"
    )


def label(body: bytes, owner: str) -> bytes:
    """The creation request body `body` with the owner label added.

    A body that already names an owner, or asks to be kept, or that is not a JSON object,
    is returned as it is: the engine judges a malformed one, as it would without the proxy.
    """
    try:
        doc = json.loads(body)
    except ValueError:
        return body
    if not isinstance(doc, dict):
        return body
    labels = doc.get("Labels")
    if labels is None:
        labels = doc["Labels"] = {}
    if not isinstance(labels, dict) or LABEL_OWNER in labels:
        return body
    if kept(labels):
        return body
    labels[LABEL_OWNER] = owner
    return json.dumps(doc).encode()


class Proxy:
    """Serves `listener` (a bound, listening unix socket) until stop(), forwarding to the
    engine socket `engine` and labelling creations with `owner`."""

    def __init__(self, listener: socket.socket, engine: str, owner: str) -> None:
        self._listener, self._engine, self._owner = listener, engine, owner
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._workers = relay.Workers()
        self.reached = False  # the engine took a connection: things may be made through it

    def start(self) -> None:
        self._thread = threading.Thread(target=self._serve, name="exitwatch-proxy", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop accepting and cut every connection still open."""
        self._stopping = True
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() under way
        if self._thread is not None:
            self._thread.join(2.0)
        self._listener.close()
        with self._lock:
            relay.cut(*self._open)
        self._workers.close()

    def _serve(self) -> None:
        while not self._stopping:
            try:
                client, _ = self._listener.accept()
            except OSError:
                if self._stopping:
                    return
                # EMFILE and the like: clients wait in the backlog meanwhile.
                time.sleep(ACCEPT_PAUSE)
                continue
            self._workers.submit(self._connection, client)

    def _connection(self, client: socket.socket) -> None:
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.connect(self._engine)
        except OSError as err:
            # The client sees the connection closed, as a dead engine's socket would refuse it.
            log.debug("engine %s: %s", self._engine, err.strerror)
            upstream.close()
            client.close()
            return
        self.reached = True
        with self._lock:
            self._open.update((client, upstream))
        back = threading.Event()
        self._workers.submit(relay.pump, upstream, client, b"", back)
        try:
            _Requests(client, upstream, self._owner).forward()
        except (OSError, h11.ProtocolError) as err:
            log.debug("proxy connection: %s", err)
            relay.cut(client, upstream)
        except Exception:  # a bug of ours: this connection is lost, not the others
            log.exception("proxy connection")
            relay.cut(client, upstream)
        back.wait()
        with self._lock:
            self._open.difference_update((client, upstream))
        client.close()
        upstream.close()


class _Requests:
    """The client-to-engine half of one connection: request by request, then raw bytes once
    the connection is hijacked or can no longer be read as HTTP."""

    def __init__(self, client: socket.socket, upstream: socket.socket, owner: str) -> None:
        self.client, self.upstream, self.owner = client, upstream, owner
        self.pending = b""  # read from the client, not forwarded yet

    def forward(self) -> None:
        while True:
            conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
            raw = bytearray(self.pending)
            if self.pending:  # b"" would tell h11 the client closed
                conn.receive_data(self.pending)
            try:
                event = self._next(conn, raw)
            except h11.RemoteProtocolError:
                # Not HTTP as h11 reads it: the engine answers it, as without the proxy.
                relay.pump(self.client, self.upstream, bytes(raw))
                return
            if isinstance(event, h11.ConnectionClosed):
                self.upstream.shutdown(socket.SHUT_WR)
                return
            assert isinstance(event, h11.Request)
            rest = conn.trailing_data[0]
            head = bytes(raw[: len(raw) - len(rest)])
            hijack = _ATTACH.fullmatch(event.target) is not None or any(
                name == b"upgrade" for name, _ in event.headers
            )
            readable = event.method == b"POST" and (
                _CREATE.fullmatch(event.target) or _EXEC_START.fullmatch(event.target)
            )
            if readable:
                body = self._whole_body(conn)
                if _CREATE.fullmatch(event.target):
                    body = label(body, self.owner)
                else:
                    hijack = hijack or not _detached(body)
                self.upstream.sendall(_head(event, len(body)) + body)
                self.pending = conn.trailing_data[0]
            else:
                self._forward_body(conn, event, head, rest)
            if hijack:
                # Raw from here on, whatever the engine answers: should it refuse (an error
                # instead of the hijack), a request the client sent next on this connection
                # would pass unlabelled. The docker CLI closes such a connection.
                relay.pump(self.client, self.upstream, self.pending)
                return

    def _next(self, conn: h11.Connection, raw: bytearray) -> h11.Event:
        while True:
            event = conn.next_event()
            if event is not h11.NEED_DATA:
                return event
            self._readable()
            data = self.client.recv(CHUNK)
            raw += data
            conn.receive_data(data)

    def _readable(self) -> None:
        """Wait until the client has sent something: recv() allocates its whole buffer
        before it blocks, and 64 idle keep-alive connections would each hold one."""
        poll = select.poll()
        poll.register(self.client, select.POLLIN)
        poll.poll()

    def _whole_body(self, conn: h11.Connection) -> bytes:
        body = bytearray()
        while True:
            event = self._next(conn, bytearray())
            if isinstance(event, h11.Data):
                body += event.data
                if len(body) > MAX_BODY:
                    raise h11.RemoteProtocolError(f"a body longer than {MAX_BODY} bytes")
            elif isinstance(event, h11.EndOfMessage):
                return bytes(body)
            else:
                raise h11.RemoteProtocolError(f"unexpected {type(event).__name__} in a body")

    def _forward_body(
        self, conn: h11.Connection, event: h11.Request, head: bytes, rest: bytes
    ) -> None:
        """Forward the head and the body as they came, and keep what follows in pending."""
        framing = dict(event.headers)
        if framing.get(b"transfer-encoding", b"").lower() == b"chunked":
            # h11 finds the body's end; the bytes forwarded are those it consumed.
            self.upstream.sendall(head)
            raw = bytearray(rest)  # given to h11, not forwarded yet; ends with its buffer
            while True:
                done = isinstance(self._next(conn, raw), h11.EndOfMessage)
                consumed = len(raw) - len(conn.trailing_data[0])
                self.upstream.sendall(raw[:consumed])
                del raw[:consumed]
                if done:
                    self.pending = bytes(raw)
                    return
        length = int(framing.get(b"content-length", b"0"))
        self.upstream.sendall(head + rest[:length])
        self.pending = rest[length:]
        left = length - min(length, len(rest))
        if left and relay.copy(self.client, self.upstream, left) < left:
            raise ConnectionResetError("the client closed the connection inside a body")


def _detached(body: bytes) -> bool:
    """Whether an exec start body asks for a detached exec (the engine hijacks otherwise)."""
    try:
        doc = json.loads(body or b"{}")
    except ValueError:
        return False
    return isinstance(doc, dict) and doc.get("Detach") is True


def _head(event: h11.Request, length: int) -> bytes:
    """The head of `event` again, its framing now a Content-Length of `length`."""
    lines = [b"%s %s HTTP/%s" % (event.method, event.target, event.http_version)]
    for name, value in event.headers.raw_items():
        if name.lower() not in (b"content-length", b"transfer-encoding"):
            lines.append(name + b": " + value)
    lines.append(b"Content-Length: %d" % length)
    return b"\r\n".join(lines) + b"\r\n\r\n"


def listen(directory: str, dir_fd: int | None = None) -> socket.socket:
    """A listening unix socket `docker.sock` in `directory`; ProxyError if the path is too
    long for a socket address (sun_path holds 108 bytes). With `dir_fd`, a descriptor of
    `directory`, it is bound in that directory whatever `directory` names by then."""
    path = os.path.join(directory, "docker.sock")
    if len(os.fsencode(path)) >= 108:
        raise ProxyError(f"{path}: too long for a unix socket address (108 bytes at most)")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(path if dir_fd is None else f"/proc/self/fd/{dir_fd}/docker.sock")
        listener.listen(BACKLOG)
    except OSError as err:
        listener.close()
        raise ProxyError(f"cannot listen on {path}: {err.strerror}") from None
    return listener
