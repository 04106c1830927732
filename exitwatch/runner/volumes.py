"""Named volumes created, labelled, before the container create that would make the engine
create them unlabelled (`docker run -v NAME:/path`, `--mount type=volume,src=NAME`).

The engine's volume create returns a volume that exists already as it is, its labels
untouched: one made before the run is never labelled, so never taken for the run's. Only a
volume this call creates carries the owner.
"""

from __future__ import annotations

import http.client
import json
import socket

from exitwatch.runner.creation import Volume

TIMEOUT = 60.0  # seconds for the engine to answer a volume create


class _Unix(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("docker", timeout=TIMEOUT)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def create(engine: str, volume: Volume) -> tuple[int, str] | None:
    """Create `volume` through the engine socket `engine` unless it exists; None when it
    is there now, else the status and the message to refuse the container create with."""
    doc: dict[str, object] = {"Name": volume.name, "Labels": dict(volume.labels)}
    if volume.driver:
        doc["Driver"] = volume.driver
    if volume.options:
        doc["DriverOpts"] = dict(volume.options)
    conn = _Unix(engine)
    try:
        conn.request(
            "POST",
            "/volumes/create",
            json.dumps(doc).encode(),
            {"Content-Type": "application/json"},
        )
        answer = conn.getresponse()
        body = answer.read()
    except (OSError, http.client.HTTPException) as err:
        return 502, f"the engine did not answer a create of volume {volume.name!r}: {err}"
    finally:
        conn.close()
    if 200 <= answer.status < 300:
        return None
    try:
        message = str(json.loads(body).get("message", ""))
    except (ValueError, AttributeError):
        message = body.decode("utf-8", "replace").strip()
    return answer.status, f"volume {volume.name!r}, created first to label it: {message}"
