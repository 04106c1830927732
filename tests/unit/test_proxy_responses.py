"""The engine-to-client half of a proxied connection (proxy/responses.py) on real socket
pairs: every byte passes on unchanged, and the framing read tells where each response ends,
whether the engine hijacked the connection, and when every answer so far has gone out."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from exitwatch.proxy.responses import ENDED, HTTP, RAW, Responses

DEADLINE = 10.0


@dataclass
class Pair:
    engine: socket.socket  # the test writes the engine's answers here
    client: socket.socket  # and reads what the client gets here
    responses: Responses
    thread: threading.Thread
    senders: list[threading.Thread]

    def answer(self, data: bytes) -> None:
        """Send `data` as the engine, from a thread: it may be more than the sockets hold
        before the client reads."""
        sender = threading.Thread(target=self.engine.sendall, args=(data,), daemon=True)
        sender.start()
        self.senders.append(sender)

    def read(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = self.client.recv(n - len(out))
            assert chunk, f"the client got {len(out)} of {n} bytes"
            out += chunk
        return out

    def idle(self) -> bool:
        """wait_idle(), within the deadline."""
        got: list[bool] = []
        t = threading.Thread(target=lambda: got.append(self.responses.wait_idle()))
        t.start()
        t.join(DEADLINE)
        assert got, "wait_idle did not return"
        return got[0]


@pytest.fixture
def pair() -> Iterator[Pair]:
    engine, upstream = socket.socketpair()
    client, downstream = socket.socketpair()
    for s in (engine, client):  # the proxy's own ends block: splice(2) needs them so
        s.settimeout(DEADLINE)
    responses = Responses(upstream, downstream)
    thread = threading.Thread(target=responses.run, daemon=True)
    thread.start()
    pair = Pair(engine, client, responses, thread, [])
    yield pair
    for sender in pair.senders:
        sender.join(DEADLINE)
    # The test's ends first: the thread sees the engine's end, or a client that is gone,
    # and ends. Its own sockets only then, as the proxy closes them only once it has ended
    # (proxy/server.py): closed under it, the next poll it registers would be given fd -1.
    for s in (engine, client):
        s.close()
    thread.join(DEADLINE)
    assert not thread.is_alive(), "the Responses thread did not end"
    upstream.close()
    downstream.close()


def ok(body: bytes, *fields: bytes) -> bytes:
    head = b"HTTP/1.1 200 OK\r\n" + b"".join(f + b"\r\n" for f in fields)
    return head + b"Content-Length: %d\r\n\r\n" % len(body) + body


def chunked(*chunks: bytes, trailers: bytes = b"") -> bytes:
    body = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(c), c) for c in chunks)
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/vnd.docker.raw-stream\r\n"
    return head + b"Transfer-Encoding: chunked\r\n\r\n" + body + b"0\r\n" + trailers + b"\r\n"


def test_sized_and_chunked_responses_pass_whole_and_each_is_counted(pair: Pair) -> None:
    big = os.urandom(3 * 1024 * 1024)  # spliced, past the buffer
    answers = [
        ok(b'{"a": 1}'),
        ok(big, b"Content-Type: application/octet-stream"),
        chunked(b"x" * 10, os.urandom(200_000), b"y", trailers=b"X-T: 1\r\n"),
        ok(b""),
    ]
    for n, data in enumerate(answers):
        pair.responses.expect(head=False, hijacking=False)
        if n == 1:
            # Split anywhere, even inside the head: the framing is found all the same.
            pair.answer(data[:7])
            pair.senders[-1].join(DEADLINE)
            pair.answer(data[7:])
        else:
            pair.answer(data)
        assert pair.read(len(data)) == data
        assert pair.idle()
    assert pair.responses.state == HTTP


def test_a_chunked_response_cut_anywhere_is_passed_whole(pair: Pair) -> None:
    data = chunked(b"a", b"bc", os.urandom(100), os.urandom(70_000), b"def", trailers=b"X: y\r\n")
    data += ok(b"next")
    pieces = [data[i : i + 5] for i in range(0, 400, 5)] + [data[400:-300]]
    pieces += [data[i : i + 3] for i in range(len(data) - 300, len(data), 3)]

    def trickle() -> None:
        for piece in pieces:
            pair.engine.sendall(piece)
            time.sleep(0.0002)

    pair.responses.expect(head=False, hijacking=False)
    pair.responses.expect(head=False, hijacking=False)
    sender = threading.Thread(target=trickle, daemon=True)
    sender.start()
    assert pair.read(len(data)) == data
    sender.join(DEADLINE)
    assert pair.idle()


def test_a_head_request_s_response_has_no_body_nor_have_204_and_304(pair: Pair) -> None:
    answers = [
        (True, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n"),
        (False, b"HTTP/1.1 204 No Content\r\n\r\n"),
        (False, b"HTTP/1.1 304 Not Modified\r\nContent-Length: 9\r\n\r\n"),
        (False, ok(b"OK")),
    ]
    for head, _ in answers:
        pair.responses.expect(head=head, hijacking=False)
    pair.answer(b"".join(data for _, data in answers))
    total = sum(len(d) for _, d in answers)
    assert pair.read(total) == b"".join(d for _, d in answers)
    assert pair.idle()


def test_an_interim_100_is_passed_on_and_the_response_still_awaited(pair: Pair) -> None:
    pair.responses.expect(head=False, hijacking=False)
    pair.answer(b"HTTP/1.1 100 Continue\r\n\r\n")
    assert pair.read(25) == b"HTTP/1.1 100 Continue\r\n\r\n"
    waiting = threading.Thread(target=pair.responses.wait_idle)
    waiting.start()
    waiting.join(0.2)
    assert waiting.is_alive()  # the final response has not come
    pair.answer(ok(b"done"))
    waiting.join(DEADLINE)
    assert not waiting.is_alive()


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/1.1 101 UPGRADED\r\nContent-Type: application/vnd.docker.raw-stream\r\n"
        b"Connection: Upgrade\r\nUpgrade: tcp\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Type: application/vnd.docker.multiplexed-stream\r\n\r\n",
    ],
)
def test_a_hijack_makes_the_rest_raw(pair: Pair, head: bytes) -> None:
    item = pair.responses.expect(head=False, hijacking=True)
    stream = head + b"HTTP/1.1 200 OK\r\n\r\n raw, not a response"
    pair.answer(stream)
    assert pair.responses.verdict(item) == RAW
    assert pair.read(len(stream)) == stream
    pair.engine.shutdown(socket.SHUT_WR)
    assert pair.client.recv(1) == b""  # the engine's end passed on as the client's


def test_a_refused_hijack_leaves_the_connection_http(pair: Pair) -> None:
    item = pair.responses.expect(head=False, hijacking=True)
    refusal = b"HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\n"
    refusal += b'Content-Length: 29\r\n\r\n{"message":"No such exec: x"}'
    pair.answer(refusal)
    assert pair.responses.verdict(item) == HTTP
    assert pair.read(len(refusal)) == refusal
    assert pair.idle()


def test_a_raw_stream_content_type_that_is_framed_is_no_hijack(pair: Pair) -> None:
    logs = chunked(b"\x01\x00\x00\x00\x00\x00\x00\x02a\n")  # docker logs, not hijacked
    item = pair.responses.expect(head=False, hijacking=True)
    pair.answer(logs)
    assert pair.responses.verdict(item) == HTTP
    assert pair.read(len(logs)) == logs


def test_a_body_that_ends_with_the_connection_makes_the_rest_raw(pair: Pair) -> None:
    pair.responses.expect(head=False, hijacking=False)
    data = b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil the end"
    pair.answer(data)
    assert pair.read(len(data)) == data
    assert not pair.idle()
    assert pair.responses.state == RAW


@pytest.mark.parametrize(
    "data",
    [
        b"SSH-2.0-not http\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    ],
)
def test_bytes_that_are_not_http_pass_on_and_end_the_conversation(pair: Pair, data: bytes) -> None:
    item = pair.responses.expect(head=False, hijacking=True)
    pair.answer(data)
    assert pair.read(len(data)) == data
    assert pair.responses.verdict(item) == ENDED
    assert not pair.idle()


def test_a_response_to_no_request_ends_the_conversation(pair: Pair) -> None:
    pair.answer(ok(b"unasked"))
    assert pair.read(len(ok(b"unasked"))) == ok(b"unasked")
    assert not pair.idle()
    assert pair.responses.state == ENDED


def test_the_engine_closing_ends_it_and_wakes_the_waiting(pair: Pair) -> None:
    item = pair.responses.expect(head=False, hijacking=True)
    pair.engine.shutdown(socket.SHUT_WR)
    assert pair.responses.verdict(item) == ENDED
    assert pair.client.recv(1) == b""
