"""What an engine's refusal is, and one line for whatever went wrong on the way to it.
Light to import: the proxy's one-shot requests (oneshot.py) raise these too."""

from __future__ import annotations

import json


class EngineRefused(Exception):
    """The engine answered, with a status other than 2xx. `message` is its own words."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}" + (f": {message}" if message else ""))
        self.status, self.reason, self.message = status, reason, message


class NotFound(EngineRefused):
    """404: no such container, network or volume (or API path)."""


def refusal(status: int, reason: str, body: bytes) -> EngineRefused:
    """The error for a non-2xx answer: NotFound for a 404."""
    return (NotFound if status == 404 else EngineRefused)(status, reason, message(body))


def message(body: bytes) -> str:
    """The engine's {"message": ...}, or the body as text."""
    try:
        doc = json.loads(body)
    except ValueError:
        return body.decode("utf-8", "replace").strip()
    return str(doc.get("message", "")) if isinstance(doc, dict) else str(doc)


def describe(err: BaseException) -> str:
    """One line saying what went wrong, from under whatever layers wrap it."""
    if isinstance(err, EngineRefused):
        return f"{err.message or err} (HTTP {err.status})"
    todo: list[BaseException] = [err]
    while todo:
        cur = todo.pop(0)
        if isinstance(cur, OSError) and cur.strerror:
            return cur.strerror
        todo += [a for a in cur.args if isinstance(a, BaseException)]
        todo += [e for e in (cur.__cause__, cur.__context__) if e is not None]
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
