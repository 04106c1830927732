"""Requests' framing as the proxy reads it from what h11 parsed, their heads written again,
and the proxy's own answers, which look like the engine's errors."""

from __future__ import annotations

import http
import json

import h11

START_BODY = 7  # bytes of a legacy start's body that the engine reads at most as none


def content_length(request: h11.Request) -> int | None:
    """The body's length, None for a chunked body (h11 has checked the framing)."""
    if any(name == b"transfer-encoding" for name, _ in request.headers):
        return None
    for name, value in request.headers:
        if name == b"content-length":
            return int(value)
    return 0


def start_body(request: h11.Request) -> bool:
    """Whether the engine decodes the body of a legacy start: one of unknown length, or
    longer than START_BODY bytes (a HostConfig of any use is longer)."""
    length = content_length(request)
    return length is None or length > START_BODY


def has_length(request: h11.Request) -> bool:
    return any(name == b"content-length" for name, _ in request.headers)


def upgrades(request: h11.Request) -> bool:
    for name, value in request.headers:
        if name == b"upgrade":
            return True
        if name == b"connection" and b"upgrade" in (t.strip().lower() for t in value.split(b",")):
            return True
    return False


def head_again(
    request: h11.Request,
    target: bytes,
    framing: list[tuple[bytes, bytes]],
    drop: tuple[bytes, ...] = (),
) -> bytes:
    """The head of `request` again, for `target`, its framing now `framing`."""
    lines = [b"%s %s HTTP/%s" % (request.method, target, request.http_version)]
    for name, value in request.headers.raw_items():
        if name.lower() not in (b"content-length", b"transfer-encoding", *drop):
            lines.append(name + b": " + value)
    lines += [name + b": " + value for name, value in framing]
    return b"\r\n".join(lines) + b"\r\n\r\n"


def answer(status: int, message: str, close: bool) -> bytes:
    """An error answer like the engine's own, which the docker CLI prints."""
    body = json.dumps({"message": f"exitwatch: {message}"}).encode() + b"\n"
    try:
        reason = http.HTTPStatus(status).phrase
    except ValueError:  # a status of the engine's own making
        reason = "Error"
    head = (
        f"HTTP/1.1 {status} {reason}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        + ("Connection: close\r\n" if close else "")
    )
    return head.encode() + b"\r\n" + body
