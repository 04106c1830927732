"""The audit log: an append-only JSON-lines record of every removal and every refusal,
bounded in size by rotation (the current file and one older, `.1`)."""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterator

log = logging.getLogger(__name__)


class AuditLog:
    """Appends one JSON object per line. Thread-safe; never raises into the caller, since
    a full disk must not stop the agent from reaping."""

    def __init__(self, path: str, max_bytes: int) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._failing = False

    def write(self, entry: dict) -> None:
        line = (json.dumps(entry, separators=(",", ":")) + "\n").encode()
        with self._lock:
            try:
                if self._fd is None:
                    self._open()
                assert self._fd is not None
                if os.fstat(self._fd).st_size + len(line) > self.max_bytes:
                    self._rotate()
                os.write(self._fd, line)
                self._failing = False
            except OSError as err:
                if not self._failing:  # one warning per run of failures, not one per entry
                    log.warning("audit log %s: cannot write: %s", self.path, err.strerror)
                self._failing = True
                self._close()

    def close(self) -> None:
        with self._lock:
            self._close()

    def _open(self) -> None:
        os.makedirs(os.path.dirname(self.path), mode=0o750, exist_ok=True)
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        self._fd = os.open(self.path, flags, 0o600)

    def _rotate(self) -> None:
        self._close()
        os.replace(self.path, self.path + ".1")
        self._open()

    def _close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read(path: str, since: float | None = None) -> Iterator[dict]:
    """Entries oldest first (the rotated file, then the current one), at or after `since`
    (a unix time). Lines that are not JSON objects are skipped."""
    for name in (path + ".1", path):
        for line in _lines(name):
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if not isinstance(entry, dict) or not isinstance(entry.get("time"), int | float):
                continue
            if since is None or entry["time"] >= since:
                yield entry


def _lines(name: str) -> Iterator[str]:
    try:
        with open(name, encoding="utf-8", errors="replace") as f:
            yield from f
    except FileNotFoundError:
        return
