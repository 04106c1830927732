"""An engine in memory: exitwatch.engine.api.Engine, the docker kind's narrow interface, and
api.Proxying, the labelling proxy's, as Ryuk's tests fake its dockerClient. Containers
with labels (compose's among them), networks and volumes, their create and destroy events
(a container's with its labels, a network's or volume's without, as the engine sends
them), and ways to fail: refuse every connection (down), queue errors for a call (a
refusal with a status, a 404, a timeout), or make a call slow. It answers as the real
engine does where the kind's rules depend on it: a 404 for what is gone, 403 for a network
with containers on it, 409 for a volume in use, the label filters, the users of a network
or volume, create and destroy events.

Give it to the kind as its client: Containers(URL, client=fake.connect); to the proxy's
volumes.create as it is."""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

from exitwatch.engine.errors import EngineRefused, NotFound
from exitwatch.engine.url import Endpoint

_ids = itertools.count(1)


def engine_time(at: float | None = None) -> str:
    """A unix time (now, by default) as the engine writes it: RFC 3339, to the ns."""
    at = time.time() if at is None else at
    whole = datetime.fromtimestamp(int(at), UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{whole}.{int(at % 1 * 1e9):09d}Z"


def refused(status: int, message: str = "refused") -> EngineRefused:
    """What the engine raises for `status` (NotFound for a 404)."""
    kind = NotFound if status == 404 else EngineRefused
    return kind(status, "Not Found" if status == 404 else "Refused", message)


def _matches(labels: Mapping[str, str], label: str) -> bool:
    """The engine's label filter: `key`, or `key=value`."""
    key, eq, value = label.partition("=")
    return key in labels and (not eq or labels[key] == value)


class FakeEvents:
    """One subscriber's events stream: what the engine says of `types` from now on, until
    close()."""

    def __init__(self, types: tuple[str, ...]) -> None:
        self.types = types
        self._queue: queue.SimpleQueue[dict[str, Any] | None] = queue.SimpleQueue()

    def put(self, event: dict[str, Any]) -> None:
        self._queue.put(event)

    def __iter__(self) -> Iterator[Any]:
        while (event := self._queue.get()) is not None:
            yield event

    def close(self) -> None:
        self._queue.put(None)


class FakeEngine:
    """The engine's state and the kind's calls on it (api.Engine). Thread-safe."""

    def __init__(self) -> None:
        self.containers_: dict[str, dict[str, Any]] = {}
        self.networks_: dict[str, dict[str, Any]] = {}
        self.volumes_: dict[str, dict[str, Any]] = {}
        self.calls: list[tuple[str, str]] = []  # (call, its first argument), in order
        self.down = False  # every connection refused, as with no engine listening
        # As podman 4.3: no events of networks made or removed (docs/podman.md).
        self.quiet_networks = False
        self.in_flight = self.most_in_flight = 0  # calls under way at once
        self._errors: dict[str, list[BaseException]] = {}
        self._delays: dict[str, float] = {}
        self._streams: list[FakeEvents] = []
        self._lock = threading.Lock()

    # -- the test's side ---------------------------------------------------------------------

    def connect(self, endpoint: Endpoint, timeout: float, concurrency: int) -> FakeEngine:
        """api.Connect: every client of the kind's is this engine."""
        return self

    def add_container(
        self,
        name: str,
        labels: Mapping[str, str] | None = None,
        *,
        created: float | None = None,
        networks: tuple[str, ...] = (),
        volumes: tuple[str, ...] = (),
        pid: int = 0,
    ) -> str:
        """A container (running `pid`, if given), on the networks and volumes named by their
        ids and names; its id. Subscribers hear of its creation."""
        cid = f"{next(_ids):064x}"
        with self._lock:
            self.containers_[cid] = {
                "Id": cid,
                "Names": [f"/{name}"],
                "Labels": dict(labels or {}),
                "Created": engine_time(created),
                "State": {"Running": bool(pid), "Pid": pid},
                "networks": set(networks),
                "volumes": set(volumes),
            }
        self._tell(cid, "create")
        return cid

    def add_network(
        self, name: str, labels: Mapping[str, str] | None = None, created: float | None = None
    ) -> str:
        """A network; its id. Subscribers hear of its creation, without its labels."""
        nid = f"{next(_ids):064x}"
        with self._lock:
            self.networks_[nid] = {
                "Id": nid,
                "Name": name,
                "Labels": dict(labels or {}),
                "Created": engine_time(created),
            }
        self._say("network", nid, "create", {"name": name, "type": "bridge"})
        return nid

    def add_volume(self, name: str, labels: Mapping[str, str] | None = None) -> str:
        """A volume; its name. Subscribers hear of its creation, without its labels."""
        with self._lock:
            self.volumes_[name] = {"Name": name, "Labels": dict(labels or {})}
        self._say("volume", name, "create", {"driver": "local"})
        return name

    def fail(self, call: str, *errors: BaseException) -> None:
        """The next calls of `call` (a method's name) raise `errors`, one each, in order."""
        with self._lock:
            self._errors.setdefault(call, []).extend(errors)

    def slow(self, call: str, seconds: float) -> None:
        """Each call of `call` takes `seconds` from now on."""
        with self._lock:
            self._delays[call] = seconds

    def hang_up(self) -> None:
        """End every events stream, as an engine that stops or restarts does."""
        with self._lock:
            streams, self._streams = self._streams, []
        for stream in streams:
            stream.close()

    def called(self, call: str) -> list[str]:
        """The first argument of each call of `call` so far."""
        with self._lock:
            return [arg for name, arg in self.calls if name == call]

    # -- api.Engine --------------------------------------------------------------------------

    def ping(self) -> None:
        self._call("ping", "")

    def containers(self, label: str) -> list[dict[str, Any]]:
        with self._answer("containers", label):
            return [self._listed(c) for c in self.containers_.values() if _has(c, label)]

    def each_container(self, label: str) -> Iterator[dict[str, Any]]:
        yield from self.containers(label)

    def events(self, since: str, types: tuple[str, ...]) -> FakeEvents:
        with self._answer("events", ",".join(types)):
            stream = FakeEvents(types)
            self._streams.append(stream)
            return stream

    def inspect(self, cid: str) -> dict[str, Any]:
        with self._answer("inspect", cid):
            c = self._container(cid)
            return {"Id": cid, "Name": c["Names"][0], "Created": c["Created"], "State": c["State"]}

    def remove_container(self, cid: str) -> None:
        with self._answer("remove_container", cid):
            c = self._container(cid)
            del self.containers_[cid]
        self._tell(cid, "destroy", c)

    def networks(self, label: str) -> list[dict[str, Any]]:
        with self._answer("networks", label):
            return [dict(n) for n in self.networks_.values() if _has(n, label)]

    def network(self, nid: str) -> dict[str, Any]:
        with self._answer("network", nid):
            if nid not in self.networks_:
                raise refused(404, f"network {nid} not found")
            return dict(self.networks_[nid])

    def users(self, kind: str, ident: str) -> list[dict[str, Any]]:
        with self._answer("users", ident):
            key = {"network": "networks", "volume": "volumes"}[kind]
            return [self._listed(c) for c in self.containers_.values() if ident in c[key]]

    def remove_network(self, nid: str) -> None:
        # The engine's words: 403 while containers are on it.
        self._remove("network", nid, 403, "error while removing network: active endpoints")

    def volumes(self, label: str) -> list[dict[str, Any]]:
        with self._answer("volumes", label):
            return [dict(v) for v in self.volumes_.values() if _has(v, label)]

    def volume(self, name: str) -> dict[str, Any]:
        with self._answer("volume", name):
            if name not in self.volumes_:
                raise refused(404, f"get {name}: no such volume")
            return dict(self.volumes_[name])

    def remove_volume(self, name: str) -> None:
        self._remove("volume", name, 409, "volume is in use")

    def _remove(self, kind: str, ident: str, busy: int, why: str) -> None:
        """Remove network or volume `ident`: a 404 if there is none, `busy` while a
        container uses it."""
        with self._answer(f"remove_{kind}", ident):
            items = self.networks_ if kind == "network" else self.volumes_
            if ident not in items:
                raise refused(404, f"no such {kind}: {ident}")
            if any(ident in c[f"{kind}s"] for c in self.containers_.values()):
                raise refused(busy, f"{ident}: {why}")
            name = items.pop(ident)["Name"]
        attributes = {"name": name, "type": "bridge"} if kind == "network" else {"driver": "local"}
        self._say(kind, ident, "destroy", attributes)

    def network_events(self) -> bool:
        self._call("network_events", "")
        return not self.quiet_networks

    def pods(self, label: str) -> list[dict[str, Any]]:
        with self._answer("pods", label):
            return []  # a Docker engine's: podman's pods are tried against the real one

    def remove_pod(self, pid: str) -> None:
        with self._answer("remove_pod", pid):
            raise refused(404, f"no such pod: {pid}")

    def close(self) -> None:
        self._call("close", "")

    # -- api.Proxying (inspect is the kind's too) ----------------------------------------------

    def create_volume(
        self, name: str, labels: Mapping[str, str], driver: str, options: Mapping[str, str]
    ) -> None:
        """As the engine does: a volume that exists already stays as it is, labels and all."""
        with self._answer("create_volume", name):
            new = name not in self.volumes_
            self.volumes_.setdefault(name, {"Name": name, "Labels": dict(labels)})
        if new:
            self._say("volume", name, "create", {"driver": driver})

    # -- inside ------------------------------------------------------------------------------

    def _call(self, call: str, arg: str) -> None:
        """Record the call, then fail it as the test asked."""
        with self._lock:
            self.calls.append((call, arg))
            queued = self._errors.get(call)
            error = queued.pop(0) if queued else None
            delay = self._delays.get(call, 0.0)
        if self.down and call != "close":
            raise ConnectionRefusedError(111, "Connection refused")
        if delay:
            time.sleep(delay)
        if error is not None:
            raise error

    def _answer(self, call: str, arg: str) -> _Answering:
        return _Answering(self, call, arg)

    def _container(self, cid: str) -> dict[str, Any]:
        if cid not in self.containers_:
            raise refused(404, f"No such container: {cid}")
        return self.containers_[cid]

    @staticmethod
    def _listed(c: dict[str, Any]) -> dict[str, Any]:
        """A container as the engine lists it (what the listing holds, no more)."""
        return {k: c[k] for k in ("Id", "Names", "Labels", "Created")} | {"State": "running"}

    def _tell(self, cid: str, action: str, c: dict[str, Any] | None = None) -> None:
        c = c or self.containers_[cid]
        self._say("container", cid, action, {**c["Labels"], "name": c["Names"][0][1:]})

    def _say(self, type_: str, ident: str, action: str, attributes: dict[str, str]) -> None:
        """An event to every subscriber that follows `type_`."""
        event = {
            "Type": type_,
            "Action": action,
            "Actor": {"ID": ident, "Attributes": attributes},
            "timeNano": time.time_ns(),
        }
        with self._lock:
            streams = list(self._streams)
            if type_ == "network" and self.quiet_networks:
                return
        for stream in streams:
            if type_ in stream.types:
                stream.put(event)


def _has(item: dict[str, Any], label: str) -> bool:
    return _matches(item.get("Labels") or {}, label)


class _Answering:
    """A call under way: recorded and failed as asked on entry, counted while it runs, and
    done under the engine's lock."""

    def __init__(self, engine: FakeEngine, call: str, arg: str) -> None:
        self._engine, self._call, self._arg = engine, call, arg

    def __enter__(self) -> None:
        e = self._engine
        with e._lock:
            e.in_flight += 1
            e.most_in_flight = max(e.most_in_flight, e.in_flight)
        try:
            e._call(self._call, self._arg)
        except BaseException:
            self._leave()
            raise
        e._lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self._engine._lock.release()
        self._leave()

    def _leave(self) -> None:
        with self._engine._lock:
            self._engine.in_flight -= 1
