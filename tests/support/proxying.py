"""Talking to the run's socket in tests: a socket in front of the private engine, raw
exchanges on one connection, and what the engine holds."""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import tempfile
from collections.abc import Iterator

import h11

from exitwatch.owner import owner_of
from exitwatch.proxy.policy import Policy
from exitwatch.proxy.server import Proxy, listen

OWNER = str(owner_of())
DEADLINE = 30.0  # seconds for any one exchange: a hang fails the test instead of holding it


@contextlib.contextmanager
def serving(engine, policy: Policy) -> Iterator[str]:
    """The path of a labelling socket in front of the private engine, with `policy`."""
    where = tempfile.mkdtemp(prefix="exitwatch-proxy-")
    proxy = Proxy(listen(where), str(engine.socket), policy)
    proxy.start()
    try:
        yield f"{where}/docker.sock"
    finally:
        proxy.stop()
        shutil.rmtree(where)


def exchange(path: str, data: bytes, count: int) -> list[tuple[int, bytes]]:
    """Send `data` on one connection; the (status, body) of up to `count` responses, fewer
    if the connection ends first."""
    out: list[tuple[int, bytes]] = []
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(DEADLINE)
        s.connect(path)
        s.sendall(data)
        conn = h11.Connection(h11.CLIENT)
        status, body = 0, b""
        while len(out) < count:
            if conn.our_state is h11.IDLE:  # h11 reads a response only after a request
                conn.send(h11.Request(method="GET", target="/", headers=[("Host", "x")]))
                conn.send(h11.EndOfMessage())
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(s.recv(65536))
            elif isinstance(event, h11.Response):
                status, body = event.status_code, b""
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                out.append((status, body))
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    break
                conn.start_next_cycle()
            elif isinstance(event, h11.ConnectionClosed):
                break
    return out


def post(target: bytes, body: bytes, *headers: bytes) -> bytes:
    head = b"POST %s HTTP/1.1\r\nHost: docker\r\nContent-Type: application/json\r\n" % target
    head += b"".join(h + b"\r\n" for h in headers)
    return head + b"Content-Length: %d\r\n\r\n" % len(body) + body


def config(image: str, **extra: object) -> bytes:
    return json.dumps({"Image": image, "Cmd": ["true"], **extra}).encode()


def containers(engine) -> dict[str, dict]:
    """Every container, by name: its labels."""
    api = engine.client.api
    return {c["Names"][0].lstrip("/"): c.get("Labels") or {} for c in api.containers(all=True)}


# Docker 26.1 (not 20.10) labels a volume it names itself so; the label names no owner.
ENGINE_LABELS = {"com.docker.volume.anonymous"}


def volumes(engine) -> list[dict]:
    """Every volume's labels, but those the engine puts on itself."""
    found = engine.client.api.volumes()["Volumes"] or []
    return [
        {k: v for k, v in (vol.get("Labels") or {}).items() if k not in ENGINE_LABELS}
        for vol in found
    ]
