"""bench/eventsfile.py: podman's events file followed as it is written, as the bench's clock
for a container's removal, through a rotation too."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from bench.eventsfile import EventsFile


def _line(cid: str, status: str, kind: str = "container") -> bytes:
    return json.dumps({"ID": cid, "Status": status, "Type": kind, "Time": "t"}).encode() + b"\n"


def _append(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


def test_a_remove_line_is_seen_when_written_and_nothing_else_counts(tmp_path: Path) -> None:
    log = tmp_path / "events.log"
    log.write_bytes(_line("old", "remove"))  # before it follows: not this run's
    events = EventsFile(str(log))
    try:
        before = time.monotonic()
        _append(log, _line("a", "died") + _line("a", "remove", kind="image") + _line("b", "rem"))
        _append(log, b"not json\n" + _line("a", "remove")[:20])  # half a line, for now
        assert not events.wait(["a"], 0.3)
        _append(log, _line("a", "remove")[20:])
        assert events.wait(["a"], 5)
        when = events.when("a")
        assert when is not None and before <= when <= time.monotonic()
        assert events.when("old") is None and events.when("b") is None
    finally:
        events.close()


def test_a_rotated_file_is_read_from_its_start_and_an_id_keeps_its_first_time(
    tmp_path: Path,
) -> None:
    log = tmp_path / "events.log"
    log.write_bytes(b"")
    events = EventsFile(str(log))
    try:
        _append(log, _line("a", "remove"))
        assert events.wait(["a"], 5)
        first = events.when("a")
        # As podman rotates: a new file with the old one's tail, renamed over it.
        new = tmp_path / "events.log.tmp"
        new.write_bytes(_line("a", "remove") + _line("b", "remove"))
        os.rename(new, log)
        assert events.wait(["b"], 5)
        assert events.when("a") == first
    finally:
        events.close()
