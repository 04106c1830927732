"""Named volumes created, labelled, before the container create that would make the engine
create them unlabelled (`docker run -v NAME:/path`, `--mount type=volume,src=NAME`).

The engine's volume create returns a volume that exists already as it is, its labels
untouched: one made before the run is never labelled, so never taken for the run's. Only a
volume this call creates carries the owner.
"""

from __future__ import annotations

import json

import h11

from exitwatch.proxy import engineapi
from exitwatch.proxy.creation import Volume

TIMEOUT = 60.0  # seconds for the engine to answer a volume create


def create(engine: str, volume: Volume) -> tuple[int, str] | None:
    """Create `volume` through the engine socket `engine` unless it exists; None when it
    is there now, else the status and the message to refuse the container create with."""
    doc: dict[str, object] = {"Name": volume.name, "Labels": dict(volume.labels)}
    if volume.driver:
        doc["Driver"] = volume.driver
    if volume.options:
        doc["DriverOpts"] = dict(volume.options)
    try:
        status, answer = engineapi.request(
            engine, "POST", "/volumes/create", json.dumps(doc).encode(), TIMEOUT
        )
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
