"""Named volumes created, labelled, before the container create that would make the engine
create them unlabelled (`docker run -v NAME:/path`, `--mount type=volume,src=NAME`).

The engine's volume create returns a volume that exists already as it is, its labels
untouched: one made before the run is never labelled, so never taken for the run's. Only a
volume this call creates carries the owner.
"""

from __future__ import annotations

from exitwatch.engine.api import Proxying
from exitwatch.engine.errors import EngineRefused
from exitwatch.engine.oneshot import NoAnswer
from exitwatch.proxy.creation import Volume

TIMEOUT = 60.0  # seconds for the engine to answer a volume create


def create(engine: Proxying, volume: Volume) -> tuple[int, str] | None:
    """Create `volume` through `engine` unless it exists; None when it is there now, else
    the status and the message to refuse the container create with."""
    try:
        engine.create_volume(volume.name, volume.labels, volume.driver, volume.options)
    except EngineRefused as err:
        return err.status, f"volume {volume.name!r}, created first to label it: {err.message}"
    except NoAnswer:
        return 502, f"the engine closed the connection on a create of volume {volume.name!r}"
    except OSError as err:
        return 502, f"the engine did not answer a create of volume {volume.name!r}: {err}"
    return None
