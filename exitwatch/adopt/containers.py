"""The containers of `exitwatch adopt`'s engine, as its clients are found in them: which
container's cgroup holds a process, the container's name and init (as the engine names
it), and whether it is meant to own what its clients create.

A container is an owner only when somebody said so: its label exitwatch.adopt=owner, or an
operator's pattern (`[adopt] containers`) that its name or its image matches. Any other
container that reaches the socket (Portainer, Watchtower, a launcher, compose run from a
container) is a client as a host process is: nobody's, unless a rule matches.
"""

from __future__ import annotations

import collections
import fnmatch
import logging
import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass

from exitwatch import procfs
from exitwatch.contract import ADOPT_OWNER, LABEL_ADOPT
from exitwatch.engine.errors import EngineRefused
from exitwatch.engine.oneshot import OneShot
from exitwatch.engine.url import Endpoint

log = logging.getLogger(__name__)

CONTAINERS = 1024  # containers whose name, init and ownership are remembered
INSPECT_TIMEOUT = 5.0  # seconds for the engine to say which container a cgroup is
# A Docker container's id in a cgroup path: /docker/ID (cgroupfs), docker-ID.scope (systemd).
_CONTAINER_ID = re.compile(r"(?:^|[/-])([0-9a-f]{64})(?:\.scope)?$", re.M)


class Unanswered(OSError):
    """The engine could not say which container a cgroup is (and none was remembered)."""


@dataclass(frozen=True)
class Container:
    name: str
    init: int  # host pid of its init, 0 when it is not running
    init_start: int
    owner: bool  # meant to own what its clients create (the label, or a pattern)


def is_owner(doc: dict, patterns: tuple[str, ...]) -> bool:
    """Whether the engine's document `doc` of a container says it is meant to be an owner:
    its label exitwatch.adopt=owner, or its name or image matches one of `patterns`."""
    config = doc.get("Config") if isinstance(doc.get("Config"), dict) else {}
    labels = config.get("Labels") if isinstance(config.get("Labels"), dict) else {}
    if str(labels.get(LABEL_ADOPT, "")).strip().lower() == ADOPT_OWNER:
        return True
    name = str(doc.get("Name", "")).lstrip("/")
    image = str(config.get("Image", ""))
    return any(fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(image, p) for p in patterns)


class Containers:
    """This engine's containers by the cgroups of their processes; remembered by id (a
    container's labels, name pattern and image do not change; its init does, on restart)."""

    def __init__(self, engine: Endpoint, patterns: Iterable[str], proc: str) -> None:
        self.patterns = tuple(patterns)
        self._engine, self._proc = OneShot(engine, INSPECT_TIMEOUT), proc
        self._lock = threading.Lock()
        self._known: collections.OrderedDict[str, Container | None] = collections.OrderedDict()

    def holding(self, pid: int, fresh: bool) -> Container | None:
        """The container whose cgroup holds `pid`, or None (no container of this engine's).
        `fresh` asks the engine again, for an init that a restart may have changed.
        Raises ProcessLookupError when `pid` is gone, Unanswered when the engine cannot
        say and nothing is remembered."""
        ids = _CONTAINER_ID.findall(procfs.cgroup(pid, self._proc))
        if not ids:
            return None
        cid = ids[-1]
        with self._lock:
            remembered = cid in self._known
            known = self._known.get(cid)
        if remembered and not fresh:
            return known
        try:
            doc = self._engine.inspect(cid)
        except EngineRefused:  # no such container (or none the engine would say)
            doc = {}
        except (OSError, ValueError) as err:
            log.debug("container %s: %s", cid[:12], err)
            if remembered:
                return known
            why = f"the engine did not say which container {cid[:12]} is: {err}"
            raise Unanswered(why) from None
        found = self._found(doc)
        with self._lock:
            self._known[cid] = found
            self._known.move_to_end(cid)
            if len(self._known) > CONTAINERS:
                self._known.popitem(last=False)
        return found

    def _found(self, doc: object) -> Container | None:
        if not isinstance(doc, dict) or not isinstance(doc.get("State"), dict):
            return None
        init = doc["State"].get("Pid") or 0
        start = 0
        if isinstance(init, int) and init > 0:
            try:
                start = procfs.read_stat(init, self._proc).starttime
            except ProcessLookupError:
                init = 0
        else:
            init = 0
        name = str(doc.get("Name", "")).lstrip("/")
        return Container(name, init, start, is_owner(doc, self.patterns))
