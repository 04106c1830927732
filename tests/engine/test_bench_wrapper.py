"""bench/wrapper.py's concurrency section counts as failures only what the engine's bytes,
directly or through the run's socket, say: not the SDK's loss of an exec's output that came
in with the 101's head (docker-py #2042, #3332), which made a busy host's bench fail once."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest
from docker.transport.unixconn import UnixHTTPConnection

from bench import wrapper
from exitwatch.proxy.policy import Always

from support.proxying import DEADLINE, OWNER, serving

pytestmark = pytest.mark.engine


@pytest.fixture
def late_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK reads an exec start's response only once the exec's output has come after its
    head, as a client on a busy host may: deterministic, where the bench's run hit it once."""
    putrequest, getresponse = UnixHTTPConnection.putrequest, UnixHTTPConnection.getresponse

    def noting(self, method, url, *args, **kwargs):
        self.exec_start = "/exec/" in url and url.endswith("/start")
        return putrequest(self, method, url, *args, **kwargs)

    def late(self):
        deadline = time.monotonic() + DEADLINE
        while getattr(self, "exec_start", False) and time.monotonic() < deadline:
            seen = self.sock.recv(65536, socket.MSG_PEEK)
            _, end, frames = seen.partition(b"\r\n\r\n")
            if not seen or (end and len(frames) > 8):  # a frame's header and some of it
                break
            time.sleep(0.01)
        return getresponse(self)

    monkeypatch.setattr(UnixHTTPConnection, "putrequest", noting)
    monkeypatch.setattr(UnixHTTPConnection, "getresponse", late)


@pytest.fixture
def proxied(engine) -> Iterator[str]:
    with serving(engine, Always(OWNER)) as path:
        yield f"unix://{path}"


def test_an_output_that_came_with_the_head_is_counted_on_either_path(
    engine, proxied, late_reader
) -> None:
    assert engine.image == wrapper.IMAGE
    assert wrapper._client_work(engine.host, 0) is None
    assert wrapper._client_work(proxied, 1) is None
