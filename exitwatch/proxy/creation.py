"""The owner label on a creation request's body, read as the engine reads it.

The engine decodes the body with Go's encoding/json into its structs: it reads the first JSON
value and ignores what follows it (dockerd 20.10; later versions refuse it), replaces
invalid UTF-8 with U+FFFD, matches a key to a field case-insensitively (with Unicode's
simple folding, so a long s, U+017F, reads as an s), and lets the last of two keys
for one field win. Python's json reads each of these otherwise, so a body is labelled only
when both must read it alike: one JSON object in UTF-8, every field that matters here
spelt as the engine names it and only once, no key twice in any object. Anything else is
refused (Refused) rather than passed on, as the engine might create from it unlabelled.

Podman's own API (libpod) decodes its bodies with the same encoding/json, into structs of
its own: a container's and a pod's labels are "labels", and their named volumes the "Name"s
of "volumes" (specgen.SpecGenerator, PodSpecGenerator: NamedVolume, made if missing); a
network's labels are "labels"; a volume's are "Label" and "Labels" together, the latter
winning (entities.VolumeCreateOptions; handlers/libpod/volumes.go), in 4.3 as in 5.4.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from exitwatch.contract import LABEL_OWNER, kept, names_an_owner
from exitwatch.proxy.routes import Route

_WHITESPACE = " \t\n\r"  # JSON's, the same for Go and Python
# Python objects cost up to ~80 bytes for each value of a body ({} in a list), 20 times the
# bytes: a body of more values than this is refused unread. A create config holds hundreds.
MAX_VALUES = 1 << 17
# Go folds a key as bytes.EqualFold does: ASCII letters by case, and the two runes whose
# simple case folding reaches one, the long s and the Kelvin sign.
_FOLD = str.maketrans(
    {**{chr(c): chr(c - 32) for c in range(ord("a"), ord("z") + 1)}, "\u017f": "S", "\u212a": "K"}
)
_MISSING = object()
_TOP = "the body"


class Refused(Exception):
    """The body is not one the proxy can be sure the engine reads as it does; one line."""


@dataclass(frozen=True)
class Volume:
    """A named volume that a container create makes the engine create if it is missing."""

    name: str
    driver: str = ""
    options: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Labelled:
    body: bytes | bytearray  # what to send on
    volumes: tuple[Volume, ...]  # to create, labelled, before the container


def label(
    route: Route, body: bytes | bytearray, owner: str, more: Mapping[str, str] | None = None
) -> Labelled:
    """The creation body `body` for `route` with `owner` (and the labels `more`) added to
    its labels, and the named volumes a container create would make. A body that names an
    owner of its own or asks to be kept is sent as it came, its volumes left to the engine;
    an owner label that names nobody (empty, malformed) is replaced by `owner`, which the
    socket knows for sure.
    A legacy start's body, which the engine reads as a create's for its HostConfig alone,
    has no labels: it is sent as it came, with the volumes it would make. Raises Refused."""
    doc = _decode(body)
    ours = {**(more or {}), LABEL_OWNER: owner}
    if route is Route.LEGACY_START:
        return Labelled(body, _created_volumes(doc, ours))
    if route in _PODMAN:
        return _podman(route, doc, body, ours)
    labels = _labels(doc, "Labels", "the body")
    if names_an_owner(labels) or kept(labels):
        return Labelled(body, ())
    doc["Labels"] = {**labels, **ours}
    volumes = _created_volumes(doc, ours) if route is Route.CONTAINER_CREATE else ()
    return Labelled(_encode(doc), volumes)


_PODMAN = {
    Route.POD_CONTAINER_CREATE,
    Route.POD_CREATE,
    Route.POD_NETWORK_CREATE,
    Route.POD_VOLUME_CREATE,
}


def _podman(route: Route, doc: dict, body: bytes | bytearray, ours: Mapping[str, str]) -> Labelled:
    """label() for a creation of podman's own API (the module's doc says its fields)."""
    if route is Route.POD_VOLUME_CREATE:
        given = _labels(doc, "Labels", "the body")
        labels = {**_labels(doc, "Label", "the body"), **given}
        key = "Labels"
    else:
        labels = given = _labels(doc, "labels", "the body")
        key = "labels"
    if names_an_owner(labels) or kept(labels):
        return Labelled(body, ())
    doc[key] = {**given, **ours}
    made: tuple[Volume, ...] = ()
    if route in (Route.POD_CONTAINER_CREATE, Route.POD_CREATE):
        made = _named_volumes(doc, ours)
    return Labelled(_encode(doc), made)


def _named_volumes(doc: dict, ours: Mapping[str, str]) -> tuple[Volume, ...]:
    """The named volumes of a podman container or pod create (its "volumes"), which podman
    makes, unlabelled, when they are missing: each with a Name (none is an anonymous volume,
    which goes with its container)."""
    found: dict[str, Volume] = {}
    for n, volume in enumerate(_list(doc, "volumes", "the body", dict)):
        name = _string(volume, "Name", f"volumes[{n}]")
        if name:
            found.setdefault(name, Volume(name, labels=dict(ours)))
    return tuple(found.values())


def _encode(doc: dict) -> bytes:
    """`doc` as JSON no longer than the body it came from, but for the label and a float's
    digits (1e15 comes back as 1000000000000000.0; MAX_VALUES bounds them): characters
    beyond ASCII as UTF-8, as they came, not as escapes up to three times as long, which
    the budget did not hold. A lone surrogate, which came as an escape, goes back as one."""
    text = json.dumps(doc, ensure_ascii=False, separators=(",", ":"))
    return text.encode("utf-8", "backslashreplace")


def _decode(body: bytes | bytearray) -> dict:
    # Each value but the first follows a comma or an opening bracket: counted at C speed,
    # those within strings too, which only errs on the side of refusing.
    values = body.count(b",") + body.count(b"[") + body.count(b"{")
    if values > MAX_VALUES:
        raise Refused(f"the body holds more than {MAX_VALUES} JSON values")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as err:
        raise Refused(f"the body is not UTF-8 (byte {err.start})") from None
    start = len(text) - len(text.lstrip(_WHITESPACE))
    if start == len(text):
        # dockerd 20.10 refuses an empty body; later ones create a volume from it.
        raise Refused("the body is empty: send {} for an empty configuration")
    decoder = json.JSONDecoder(object_pairs_hook=_object, parse_constant=_constant)
    try:
        doc, end = decoder.raw_decode(text, start)
    except RecursionError:
        raise Refused("the body nests deeper than the proxy reads") from None
    except ValueError as err:
        raise Refused(f"the body is not JSON: {err}") from None
    if text[end:].strip(_WHITESPACE):
        raise Refused(f"the body goes on after its JSON value (at character {end})")
    if not isinstance(doc, dict):
        raise Refused(f"the body is a JSON {type(doc).__name__}, not an object")
    return doc


def _object(pairs: list[tuple[str, object]]) -> dict:
    doc: dict = {}
    for key, value in pairs:
        if key in doc:
            # Python keeps the last value where the first was; Go decodes both, in order.
            raise ValueError(f"the key {key!r} comes twice in one object")
        doc[key] = value
    return doc


def _constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def _field(obj: dict, name: str, where: str) -> object:
    """obj's value for the Go field `name`, _MISSING if none; Refused for a key that Go
    reads as that field but that is spelt otherwise, or that comes with another such key."""
    folded = name.translate(_FOLD)
    keys = [k for k in obj if k.translate(_FOLD) == folded]
    if not keys:
        return _MISSING
    if keys != [name]:
        shown = ", ".join(repr(k) for k in keys)
        raise Refused(f"{where}: the engine reads {shown} as its field {name!r}: write it once, so")
    value = obj[name]
    return _MISSING if value is None else value


def _struct(obj: dict, name: str, where: str) -> dict:
    value = _field(obj, name, where)
    if value is _MISSING:
        return {}
    if not isinstance(value, dict):
        raise Refused(f"{where}: {name} is not an object")
    return value


def _labels(obj: dict, name: str, where: str) -> dict[str, str]:
    value = _struct(obj, name, where)
    if not all(isinstance(v, str) for v in value.values()):
        raise Refused(f"{where}: {name} has a value that is not a string")
    return value


def _list(obj: dict, name: str, where: str, kind: type) -> list:
    value = _field(obj, name, where)
    if value is _MISSING:
        return []
    if not isinstance(value, list) or not all(isinstance(v, kind | None) for v in value):
        raise Refused(f"{where}: {name} is not a list of {kind.__name__} values")
    return [v for v in value if v is not None]


def _string(obj: dict, name: str, where: str) -> str:
    value = _field(obj, name, where)
    if value is _MISSING:
        return ""
    if not isinstance(value, str):
        raise Refused(f"{where}: {name} is not a string")
    return value


def _created_volumes(doc: dict, ours: Mapping[str, str]) -> tuple[Volume, ...]:
    """The named volumes of a container create: its HostConfig's, or, where that is missing
    or null, those of the HostConfig fields at the top of the body. dockerd 20.10 embeds a
    HostConfig in the body's struct beside "HostConfig", for old clients, and reads it in
    that case; a VolumeDriver at the top also stands in for an empty one in the HostConfig
    (runconfig's getHostConfig). Later engines read the HostConfig alone: volumes made
    first from the top's fields are then the run's, unused, and go with it."""
    host = _field(doc, "HostConfig", "the body")
    if host is _MISSING:
        return _volumes(doc, "", _TOP, ours)
    if not isinstance(host, dict):
        raise Refused("the body: HostConfig is not an object")
    return _volumes(host, _string(doc, "VolumeDriver", _TOP), "HostConfig", ours)


def _volumes(host: dict, driver: str, where: str, ours: Mapping[str, str]) -> tuple[Volume, ...]:
    """The named volumes of the HostConfig `host` (found at `where`; `driver`, the volume
    driver where it names none): the Binds whose source is a name (not an absolute path,
    as the engine's mount parser tells them), and the Mounts of Type volume with a Source.
    Those whose own labels name an owner or ask to be kept are the engine's to create."""
    found: dict[str, Volume] = {}
    driver = _string(host, "VolumeDriver", where) or driver
    for bind in _list(host, "Binds", where, str):
        parts = bind.split(":")
        if len(parts) in (2, 3) and parts[0] and not parts[0].startswith("/"):
            found.setdefault(parts[0], Volume(parts[0], driver))
    for n, mount in enumerate(_list(host, "Mounts", where, dict)):
        at = f"Mounts[{n}]" if where == _TOP else f"{where}.Mounts[{n}]"
        source = _string(mount, "Source", at)
        if _string(mount, "Type", at) != "volume" or not source:
            continue
        options = _struct(mount, "VolumeOptions", at)
        at += ".VolumeOptions"
        labels = _labels(options, "Labels", at)
        config = _struct(options, "DriverConfig", at)
        at += ".DriverConfig"
        name, opts = _string(config, "Name", at), _labels(config, "Options", at)
        if not names_an_owner(labels) and not kept(labels):
            found.setdefault(source, Volume(source, name, opts, labels))
    return tuple(Volume(v.name, v.driver, v.options, {**v.labels, **ours}) for v in found.values())
