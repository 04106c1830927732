"""One request of the proxy's own to the engine (a volume created first, a container looked
up), on a connection of its own, with h11 rather than http.client, whose imports of ssl and
email cost the wrapper 2 MB."""

from __future__ import annotations

import socket

import h11

MAX_ANSWER = 1024 * 1024  # bytes of the engine's answer read, at most


def request(
    engine: str, method: str, target: str, body: bytes | None, timeout: float
) -> tuple[int, bytes]:
    """The status and body of the engine's answer to `method` `target` (with a JSON
    `body`) on the engine socket `engine`; status 0 if it closed without one. Raises
    OSError and h11.ProtocolError (an answer over MAX_ANSWER among them)."""
    conn = h11.Connection(h11.CLIENT)
    headers = [("Host", "docker"), ("Connection", "close")]
    if body is not None:
        headers += [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
    data = conn.send(h11.Request(method=method, target=target, headers=headers))
    if body is not None:
        data += conn.send(h11.Data(data=body))
    data += conn.send(h11.EndOfMessage())
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as sock:
        sock.settimeout(timeout)
        sock.connect(engine)
        sock.sendall(data)
        return _answer(conn, sock)


def _answer(conn: h11.Connection, sock: socket.socket) -> tuple[int, bytes]:
    status, body = 0, b""
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(sock.recv(65536))
        elif isinstance(event, h11.Response):
            status = event.status_code
        elif isinstance(event, h11.Data):
            body += event.data
            if len(body) > MAX_ANSWER:
                raise h11.RemoteProtocolError("the engine's answer is too long")
        elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
            return status, body
