"""The kind's removals as the engine takes them: a bounded number of attempts, of which a
404 counts as done, a refusal below 500 (but those named) is final, and anything else
proves nothing and is tried again; and the error the kind raises when the engine does not
answer."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from exitwatch.engine.client import ENGINE_ERRORS
from exitwatch.engine.errors import EngineRefused, NotFound, describe
from exitwatch.kinds.base import Unavailable

# Tries of one engine call within one of the agent's attempts at a removal, the pause
# between them doubling from RETRY_PAUSE. Two layers: a call that fails every try fails that
# attempt, and the agent tries the job again, up to reap_attempts attempts in all
# (agent/removals.py). So a removal may be sent to the engine ATTEMPTS x reap_attempts
# times (3 x 3 = 9 by default); a failure says its tries ("..., after 3 tries"), and the
# agent's last line its attempts.
ATTEMPTS = 3
RETRY_PAUSE = 0.2


class EngineError(Unavailable):
    """The Docker engine did not answer, or refused. The message is one line naming it."""


def attempt(call: Callable[[], None], again: tuple[int, ...] = (409,)) -> tuple[bool, str]:
    """Run one removal up to ATTEMPTS tries, within one of the agent's attempts (see
    ATTEMPTS): (done, "removed" / "already gone" / why not, with the tries it took when
    more than one). A client error ends it at once, but for the statuses in `again`."""
    problem, tries = "", 0
    for n in range(ATTEMPTS):
        tries = n + 1
        try:
            call()
            return True, "removed"
        except NotFound:
            return True, "already gone"
        except ENGINE_ERRORS as err:
            problem = describe(err)
            # A refusal stays a refusal (a redirect too: nothing was done), but for a 5xx;
            # 409 is mostly "removal already in progress".
            if isinstance(err, EngineRefused) and err.status < 500 and err.status not in again:
                break
        if n + 1 < ATTEMPTS:
            time.sleep(RETRY_PAUSE * 2**n)
    return False, problem if tries == 1 else f"{problem}, after {tries} tries"


def name_of(listed: dict[str, Any]) -> str:
    """The name of a container as the engine lists it."""
    return (listed.get("Names") or [""])[0].lstrip("/")
