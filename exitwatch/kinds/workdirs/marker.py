"""The owner marker of a workdir: reading it through a pinned descriptor, parsing it, and
whether it may claim its directory."""

from __future__ import annotations

import json
import os

from exitwatch.contract import MARKER, MARKER_MAX_BYTES, nests_too_deeply
from exitwatch.kinds import fsops
from exitwatch.owner import Owner, OwnerError


class MarkerError(ValueError):
    """A malformed marker; the message says what is wrong with it."""


def read(dir_fd: int) -> tuple[Owner, os.stat_result]:
    """The owner the marker in directory `dir_fd` names, and the marker's stat.

    Raises FileNotFoundError when there is no marker, MarkerError when it is malformed,
    and another OSError when it cannot be read now (a lease, a full fd table): that says
    nothing about the marker, so nothing may be concluded or remembered from it.
    """
    pfd = fsops.pin(dir_fd, MARKER)
    try:
        st = os.fstat(pfd)
        return read_pinned(pfd, st), st
    finally:
        os.close(pfd)


def read_pinned(pfd: int, st: os.stat_result) -> Owner:
    """The owner the marker pinned by `pfd` (of fstat `st`) names. Raises MarkerError, or
    another OSError when it cannot be read now."""
    try:
        data = fsops.read_pinned(pfd, st, MARKER_MAX_BYTES)
    except fsops.NotRegular as err:
        raise MarkerError(str(err)) from None
    owner = _parsed.get(data)
    if owner is None:
        owner = _parse(data)
        if len(_parsed) >= PARSED_MAX:
            _parsed.clear()
        _parsed[data] = owner
    return owner


# Markers are few texts written many times (a runner marks all its workdirs alike): a walk
# of 100,000 parses each text once. Only well-formed ones are kept; a bad one raises.
PARSED_MAX = 4096
_parsed: dict[bytes, Owner] = {}


def _parse(data: bytes) -> Owner:
    if len(data) > MARKER_MAX_BYTES:
        raise MarkerError(f"is larger than {MARKER_MAX_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise MarkerError("is not UTF-8") from None
    if nests_too_deeply(text):
        raise MarkerError("is JSON nested too deeply")
    try:
        body = json.loads(text)
    except ValueError:
        raise MarkerError("is not JSON") from None
    if not isinstance(body, dict) or not isinstance(body.get("owner"), str):
        raise MarkerError('has no "owner" string')
    try:
        return Owner.parse(body["owner"])
    except OwnerError as err:
        raise MarkerError(f"names a bad owner: {err}") from None


def claim(dst: os.stat_result, mst: os.stat_result) -> str | None:
    """Why the marker `mst` cannot claim its directory `dst`, or None when it can.

    Anyone may write a marker into a directory they can write to, but only the directory's
    owner (or root) may claim it; a hard link would let a marker root wrote for one
    directory claim another.
    """
    if mst.st_uid not in (dst.st_uid, 0):
        return f"belongs to uid {mst.st_uid}, the directory to uid {dst.st_uid}"
    if mst.st_nlink != 1:
        return f"has {mst.st_nlink} hard links"
    return None
