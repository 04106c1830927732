"""An engine that lies and floods, spoken to by the real client over a real socket: a
user's rootless engine answers whatever its user wants, and nothing it sends may take the
agent's memory or hang a call for good (engine/http.py's and client.py's bounds)."""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from exitwatch.engine import http
from exitwatch.engine.client import MAX_ENTRY, Client
from exitwatch.engine.url import Endpoint

Answer = Callable[[socket.socket], None]


def _head(sock: socket.socket, length: int | None = None) -> None:
    size = f"Content-Length: {length}\r\n" if length is not None else ""
    sock.sendall(f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n{size}\r\n".encode())


def _json(body: object) -> Answer:
    data = json.dumps(body).encode()
    return lambda sock: (_head(sock, len(data)), sock.sendall(data))


@contextlib.contextmanager
def lying(routes: dict[str, Answer]) -> Iterator[Endpoint]:
    """An engine at a socket of its own answering each path that starts with a key of
    `routes` as told; /_ping says API 1.41."""
    ping = b"HTTP/1.1 200 OK\r\nApi-Version: 1.41\r\nContent-Length: 2\r\n\r\nOK"
    routes = {"/_ping": lambda sock: sock.sendall(ping), **routes}
    where = Path(tempfile.mkdtemp(prefix="ew-lie-"))
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(where / "e.sock"))
    server.listen()

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                request = b""
                while b"\r\n\r\n" not in request:
                    piece = conn.recv(4096)
                    if not piece:
                        break
                    request += piece
                path = request.split(b" ")[1].decode() if request else ""
                for prefix, answer in routes.items():
                    if path.startswith(prefix):
                        with contextlib.suppress(OSError):
                            answer(conn)
                        break

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield Endpoint.parse(f"unix://{where}/e.sock")
    finally:
        server.shutdown(socket.SHUT_RDWR)
        server.close()
        thread.join(5)
        shutil.rmtree(where)


@pytest.mark.parametrize("length", [True, False], ids=["content-length", "chunked"])
def test_an_answer_over_the_bound_is_refused_not_read_whole(monkeypatch, length) -> None:
    monkeypatch.setattr(http, "MAX_ANSWER", 1 << 20)
    flood = 8 << 20

    def networks(sock: socket.socket) -> None:
        if length:
            _head(sock, flood)
            sock.sendall(b"[" + b" " * (flood - 2) + b"]")
            return
        sock.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        piece = b" " * 65536
        for _ in range(flood // len(piece)):
            sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))

    with (
        lying({"/v1.41/networks": networks}) as endpoint,
        pytest.raises(OSError, match="over 1 MiB"),
    ):
        Client(endpoint, 10).networks("exitwatch.owner")


def test_an_events_line_without_end_is_refused() -> None:
    def events(sock: socket.socket) -> None:
        _head(sock)
        sock.sendall(b"{" + b" " * (http.MAX_LINE + 10))

    with lying({"/v1.41/events": events}) as endpoint:
        stream = Client(endpoint, 10).events("0", ("container",))
        with pytest.raises(OSError, match="over 1 MiB"):
            list(stream)
        stream.close()


def test_a_listing_entry_over_the_bound_is_refused() -> None:
    def containers(sock: socket.socket) -> None:
        _head(sock)
        sock.sendall(b'[{"Id": "' + b"a" * (MAX_ENTRY + 10))

    with (
        lying({"/v1.41/containers/json": containers}) as endpoint,
        pytest.raises(ValueError, match="entry over 1 MiB"),
    ):
        Client(endpoint, 10).containers("exitwatch.owner")


def test_an_engine_that_never_answers_times_out() -> None:
    hold = threading.Event()
    with lying({"/v1.41/networks": lambda sock: hold.wait(10)}) as endpoint:
        with pytest.raises(OSError):
            Client(endpoint, 0.5).networks("exitwatch.owner")
        hold.set()
