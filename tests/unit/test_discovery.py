"""The discovery toolkit on its own (exitwatch/kinds/discovery.py): a listing told as a
Snapshot, then as the changes between listings; rescans that count, log and space out
their failures, and stop at once."""

from __future__ import annotations

import logging
import os
import threading
import time

import pytest

from exitwatch.kinds.base import Found, Gone, Resource, Snapshot
from exitwatch.kinds.discovery import (
    Fallback,
    Listing,
    Rescans,
    Stopped,
    backoff,
    every,
    inotify_else_rescans,
)
from exitwatch.owner import Owner

log = logging.getLogger("test.discovery")

A = Owner("boot", 100, 1)
B = Owner("boot", 200, 2)


def _res(key: str, owner: Owner = A) -> Resource:
    return Resource("thing", key, owner)


def _listing() -> tuple[Listing, list]:
    told: list = []
    return Listing("thing", told.append), told


def test_the_first_listing_is_a_snapshot_in_key_order():
    listing, told = _listing()
    listing.report({"b": _res("b"), "a": _res("a")})
    assert told == [Snapshot("thing", (_res("a"), _res("b")))]
    listing.report({"a": _res("a"), "b": _res("b")})
    assert len(told) == 1  # nothing changed: nothing told


def test_an_empty_first_listing_is_told_too():
    listing, told = _listing()
    listing.report({})
    assert told == [Snapshot("thing", ())] and listing.known == {}


def test_later_listings_tell_gone_first_then_new_and_changed():
    listing, told = _listing()
    listing.report({"a": _res("a"), "b": _res("b"), "c": _res("c")})
    told.clear()
    listing.report({"a": _res("a"), "b": _res("b", B), "d": _res("d")})
    assert told == [Gone("thing", "c"), Found(_res("b", B)), Found(_res("d"))]
    assert listing.known == {"a": _res("a"), "b": _res("b", B), "d": _res("d")}


def test_a_listing_of_some_keys_changes_only_those():
    listing, told = _listing()
    listing.report({"x/1": _res("x/1"), "x/2": _res("x/2"), "y/1": _res("y/1")})
    told.clear()
    # x looked at again: x/1 went, x/3 came; y/1 is not in the listing, and stays.
    listing.report({"x/2": _res("x/2"), "x/3": _res("x/3")}, ["x/1", "x/2", "x/3"])
    assert told == [Gone("thing", "x/1"), Found(_res("x/3"))]
    assert set(listing.known or {}) == {"x/2", "x/3", "y/1"}


def test_a_key_gone_that_was_never_told_is_not_told_gone():
    listing, told = _listing()
    listing.report({})
    listing.report({}, ["never"])
    assert told == [Snapshot("thing", ())]


def test_backoff_doubles_each_failure_in_a_row_up_to_the_most():
    pause = backoff(1.0, 60.0)
    assert [pause(0.0, n) for n in range(8)] == [1, 2, 4, 8, 16, 32, 60, 60]
    assert backoff(90.0, 60.0)(0.0, 0) == 90.0  # a pass that succeeded waits its interval
    assert every(1.0)(5.0, 3) == 1.0


def _flaky(fails: int, then: dict) -> object:
    calls: list = []

    def look() -> dict:
        calls.append(None)
        if len(calls) <= fails:
            raise OSError(f"injected {len(calls)}")
        return then

    return look


def test_failures_are_counted_and_logged_whole_once_then_a_line_each(caplog):
    rescans = Rescans("things", backoff(1.0, 60.0), log)
    listing, told = _listing()
    look = _flaky(3, {"a": _res("a")})
    with caplog.at_level(logging.WARNING, logger=log.name):
        assert [rescans.once(look, listing) for _ in range(3)] == [False] * 3
        assert rescans.next == 8.0
        assert rescans.health() == {
            "rescans": 0,
            "failures": 3,
            "failing": 3,
            "last_error": "OSError: injected 3",
        }
        assert rescans.once(look, listing) and rescans.next == 1.0
    assert told == [Snapshot("thing", (_res("a"),))]
    assert rescans.health() | {"last_error": None} == {
        "rescans": 1,
        "failures": 3,
        "failing": 0,
        "last_error": None,
    }
    assert [r.getMessage() for r in caplog.records] == [
        "things: a rescan failed: injected 1; again in 2 s",
        "things: rescan failed 2 times in a row: injected 2; again in 4 s",
        "things: rescan failed 3 times in a row: injected 3; again in 8 s",
    ]


def test_an_unexpected_failure_comes_with_its_traceback_and_without_repeat_once(caplog):
    rescans = Rescans("things", every(1.0), log, expected=(KeyError,), repeat=False)
    listing, told = _listing()

    def broken() -> dict:
        raise RuntimeError("a bug")

    with caplog.at_level(logging.WARNING, logger=log.name):
        for _ in range(3):
            rescans.once(broken, listing)
    assert [(r.getMessage(), bool(r.exc_info)) for r in caplog.records] == [
        ("things: a rescan failed; again in 1 s", True)
    ]
    assert rescans.health()["failing"] == 3 and told == []


@pytest.fixture
def stop_pipe():
    r, w = os.pipe()
    yield r, w
    os.close(r)
    os.close(w)


def test_run_passes_until_the_stop_which_ends_a_pause_at_once(stop_pipe):
    stop_r, stop_w = stop_pipe
    rescans = Rescans("things", every(60.0), log)
    listing, told = _listing()
    thread = threading.Thread(target=rescans.run, args=(stop_r, lambda: {}, listing))
    thread.start()
    deadline = time.monotonic() + 10
    while not told and time.monotonic() < deadline:
        time.sleep(0.01)
    assert told == [Snapshot("thing", ())]  # the first pass comes at once
    asked = time.monotonic()
    os.write(stop_w, b"x")
    thread.join(10)
    assert not thread.is_alive() and time.monotonic() - asked < 5
    assert rescans.health()["rescans"] == 1


def _raising(err: Exception) -> object:
    def follow() -> None:
        raise err

    return follow


@pytest.mark.parametrize(
    ("err", "why", "traceback"),
    [
        (Fallback("inotify watch limit reached"), "inotify watch limit reached", False),
        (OSError(24, "Too many open files"), "inotify failed: Too many open files", False),
        (RuntimeError("a bug"), "inotify discovery failed", True),
    ],
)
def test_inotify_that_cannot_follow_falls_back_to_rescans_once_and_says_why(
    caplog, err, why, traceback
):
    rescanned: list[str] = []
    with caplog.at_level(logging.WARNING, logger=log.name):
        inotify_else_rescans("thing discovery", log, _raising(err), rescanned.append)
    assert rescanned == [why]
    lines = [(r.getMessage(), bool(r.exc_info)) for r in caplog.records]
    assert lines[-1] == (f"thing discovery falls back to rescans: {why}", False)
    assert lines[:-1] == ([("inotify thing discovery failed", True)] if traceback else [])


def test_inotify_that_follows_until_the_stop_never_rescans(caplog):
    rescanned: list[str] = []
    inotify_else_rescans("thing discovery", log, lambda: None, rescanned.append)
    inotify_else_rescans("thing discovery", log, _raising(Stopped()), rescanned.append)
    assert rescanned == [] and not caplog.records
