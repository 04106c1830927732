"""The labelling proxy's own calls to the engine (a volume created first, a container looked
up; api.Proxying), each one request on a connection of its own, unversioned, with h11
rather than http.client (http.py), whose imports of ssl and email cost the wrapper 2 MB."""

from __future__ import annotations

import json
import socket
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import h11

from exitwatch.engine.errors import refusal
from exitwatch.engine.url import Endpoint

MAX_ANSWER = 1024 * 1024  # bytes of the engine's answer read, at most


class NoAnswer(OSError):
    """The engine closed the connection without an answer."""


class OneShot:
    """The proxy's calls (api.Proxying) to the engine at `endpoint`, each given `timeout`
    seconds. Raises as api.py says; NoAnswer when the engine closed without answering."""

    def __init__(self, endpoint: Endpoint, timeout: float) -> None:
        self._endpoint, self._timeout = endpoint, timeout

    def create_volume(
        self, name: str, labels: Mapping[str, str], driver: str, options: Mapping[str, str]
    ) -> None:
        doc: dict[str, object] = {"Name": name, "Labels": dict(labels)}
        if driver:
            doc["Driver"] = driver
        if options:
            doc["DriverOpts"] = dict(options)
        self._call("POST", "/volumes/create", json.dumps(doc).encode())

    def inspect(self, cid: str) -> Any:
        return json.loads(self._call("GET", f"/containers/{quote(cid, safe='')}/json", None))

    def _call(self, method: str, target: str, body: bytes | None) -> bytes:
        try:
            status, reason, answer = request(self._endpoint, method, target, body, self._timeout)
        except h11.ProtocolError as err:  # an answer over MAX_ANSWER among them
            raise OSError(str(err)) from err
        if not status:
            raise NoAnswer("the engine closed the connection without an answer")
        if not 200 <= status < 300:
            raise refusal(status, reason, answer)
        return answer


def request(
    engine: Endpoint, method: str, target: str, body: bytes | None, timeout: float
) -> tuple[int, str, bytes]:
    """The status, reason and body of the engine's answer to `method` `target` (with a JSON
    `body`) from `engine`; status 0 if it closed without one. Raises OSError and
    h11.ProtocolError (an answer over MAX_ANSWER among them)."""
    conn = h11.Connection(h11.CLIENT)
    headers = [("Host", "docker"), ("Connection", "close")]
    if body is not None:
        headers += [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
    data = conn.send(h11.Request(method=method, target=target, headers=headers))
    if body is not None:
        data += conn.send(h11.Data(data=body))
    data += conn.send(h11.EndOfMessage())
    with engine.connect(timeout) as sock:
        sock.sendall(data)
        return _answer(conn, sock)


def _answer(conn: h11.Connection, sock: socket.socket) -> tuple[int, str, bytes]:
    status, reason, body = 0, "", b""
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(sock.recv(65536))
        elif isinstance(event, h11.Response):
            status, reason = event.status_code, event.reason.decode("latin-1")
        elif isinstance(event, h11.Data):
            body += event.data
            if len(body) > MAX_ANSWER:
                raise h11.RemoteProtocolError("the engine's answer is too long")
        elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
            return status, reason, body
