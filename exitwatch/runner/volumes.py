"""Named volumes created, labelled, before the container create that would make the engine
create them unlabelled (`docker run -v NAME:/path`, `--mount type=volume,src=NAME`).

The engine's volume create returns a volume that exists already as it is, its labels
untouched: one made before the run is never labelled, so never taken for the run's. Only a
volume this call creates carries the owner.
"""

from __future__ import annotations

import json
import socket

import h11

from exitwatch.runner.creation import Volume

TIMEOUT = 60.0  # seconds for the engine to answer a volume create
MAX_ANSWER = 1024 * 1024  # bytes of the engine's answer read, at most


def create(engine: str, volume: Volume) -> tuple[int, str] | None:
    """Create `volume` through the engine socket `engine` unless it exists; None when it
    is there now, else the status and the message to refuse the container create with."""
    doc: dict[str, object] = {"Name": volume.name, "Labels": dict(volume.labels)}
    if volume.driver:
        doc["Driver"] = volume.driver
    if volume.options:
        doc["DriverOpts"] = dict(volume.options)
    body = json.dumps(doc).encode()
    # h11 rather than http.client, whose import of ssl and email costs the wrapper 2 MB.
    conn = h11.Connection(h11.CLIENT)
    headers = [
        ("Host", "docker"),
        ("Content-Type", "application/json"),
        ("Content-Length", str(len(body))),
        ("Connection", "close"),
    ]
    request = conn.send(h11.Request(method="POST", target="/volumes/create", headers=headers))
    request += conn.send(h11.Data(data=body)) + conn.send(h11.EndOfMessage())
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as sock:
            sock.settimeout(TIMEOUT)
            sock.connect(engine)
            sock.sendall(request)
            status, answer = _answer(conn, sock)
    except (OSError, h11.ProtocolError) as err:
        return 502, f"the engine did not answer a create of volume {volume.name!r}: {err}"
    if not status:
        return 502, f"the engine closed the connection on a create of volume {volume.name!r}"
    if 200 <= status < 300:
        return None
    try:
        message = str(json.loads(answer).get("message", ""))
    except (ValueError, AttributeError):
        message = answer.decode("utf-8", "replace").strip()
    return status, f"volume {volume.name!r}, created first to label it: {message}"


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
