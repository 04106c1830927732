"""sd_notify (service/systemd.py, Notifier) against a real datagram socket standing for
systemd's: NOTIFY_SOCKET as a path and as an abstract "@name", WATCHDOG_USEC and
WATCHDOG_PID, and a watchdog ping sent at most once per interval however often the loop
pings. engine/test_operations.py and engine/test_lifecycle.py see a real agent notify."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from exitwatch.service import systemd
from exitwatch.service.systemd import Notifier


class Clock:
    """time for the systemd module, its monotonic clock set by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[tuple[str, socket.socket]]:
    """systemd's side: a datagram socket bound to a path; (that path, the socket)."""
    path = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(path)
        yield path, sock


def received(sock: socket.socket) -> list[str]:
    """Every datagram queued on `sock` now (a local datagram is queued by the time its
    sendto returns)."""
    out = []
    sock.setblocking(False)
    while True:
        try:
            out.append(sock.recv(4096).decode())
        except BlockingIOError:
            return out


def test_a_message_goes_to_the_socket_named_by_path(listener):
    path, sock = listener
    Notifier({"NOTIFY_SOCKET": path}).send("READY=1")
    assert received(sock) == ["READY=1"]


def test_an_at_sign_names_an_abstract_socket():
    name = f"exitwatch-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        Notifier({"NOTIFY_SOCKET": "@" + name}).send("STOPPING=1")
        assert received(sock) == ["STOPPING=1"]


def test_without_notify_socket_or_with_nobody_there_nothing_fails(tmp_path):
    quiet = Notifier({"WATCHDOG_USEC": "1000000"})
    quiet.send("READY=1")
    quiet.ping()
    gone = Notifier({"NOTIFY_SOCKET": str(tmp_path / "nobody")})
    gone.send("READY=1")  # a systemd that went away has nobody to tell
    assert quiet.watchdog_interval == 0.5 and gone.watchdog_interval is None


@pytest.mark.parametrize(
    ("env", "interval"),
    [
        ({"WATCHDOG_USEC": "200000"}, 0.1),  # half the timeout, as sd_watchdog_enabled(3) says
        ({"WATCHDOG_USEC": "200000", "WATCHDOG_PID": str(os.getpid())}, 0.1),
        ({"WATCHDOG_USEC": "200000", "WATCHDOG_PID": str(os.getpid() + 1)}, None),  # not ours
        ({"WATCHDOG_USEC": "200000", "WATCHDOG_PID": ""}, 0.1),
        ({"WATCHDOG_USEC": "0.2"}, None),
        ({"WATCHDOG_USEC": "-200000"}, None),
        ({"WATCHDOG_USEC": ""}, None),
        ({}, None),
    ],
)
def test_the_watchdog_interval_is_half_the_timeout_for_our_pid_only(env, interval):
    assert Notifier(env).watchdog_interval == interval


def test_a_ping_is_sent_at_most_once_per_interval(listener, monkeypatch):
    path, sock = listener
    clock = Clock()
    monkeypatch.setattr(systemd, "time", clock)
    notifier = Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "2000000"})  # every 1 s
    notifier.ping()
    assert received(sock) == ["WATCHDOG=1"]  # the first at once
    for step in (0.25, 0.5, 0.999):
        clock.now = 1000.0 + step
        notifier.ping()
    assert received(sock) == []
    clock.now = 1001.0
    notifier.ping()
    notifier.ping()
    assert received(sock) == ["WATCHDOG=1"]
    clock.now = 1001.5  # half an interval after the last ping, not after the first
    notifier.ping()
    assert received(sock) == []
    clock.now = 1002.0
    notifier.ping()
    assert received(sock) == ["WATCHDOG=1"]


def test_without_a_watchdog_a_ping_sends_nothing(listener):
    path, sock = listener
    notifier = Notifier({"NOTIFY_SOCKET": path})
    notifier.ping()
    notifier.send("READY=1")
    assert received(sock) == ["READY=1"]
