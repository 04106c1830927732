"""The container kind's parts that need no engine: a kind pointed at a socket nobody
answers on, the HTTP client against answers no engine gives (a stand-in on a unix socket),
the streamed JSON listing, and the agent's imports. tests/engine/test_unixhttp.py has the
client against the real engine."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

import exitwatch
from exitwatch.engine import errors
from exitwatch.engine import http as enginehttp
from exitwatch.engine.client import Client, json_array
from exitwatch.engine.errors import describe
from exitwatch.engine.url import Endpoint
from exitwatch.kinds.docker import attempts
from exitwatch.kinds.docker.attempts import EngineError
from exitwatch.kinds.docker.kind import Containers

from support.procs import wait_for


def test_without_an_engine_ping_says_so_and_scan_raises(tmp_path: Path) -> None:
    nowhere = Containers(f"unix://{tmp_path}/docker.sock")
    problem = nowhere.ping()
    assert problem is not None and str(tmp_path) in problem and "\n" not in problem
    with pytest.raises(EngineError, match=str(tmp_path)):
        nowhere.scan()


def test_stop_ends_the_thread_even_without_an_engine(tmp_path: Path) -> None:
    nowhere = Containers(f"unix://{tmp_path}/docker.sock")
    nowhere.start(lambda change: None)
    wait_for(lambda: nowhere.last_error, what="a failed connection")
    assert not nowhere.connected
    nowhere.stop()
    assert "exitwatch-docker-events" not in {t.name for t in threading.enumerate()}


def test_json_array_yields_items_whatever_the_chunk_boundaries():
    items = [{"Id": str(n), "Names": ["/é-ü-" + "x" * n]} for n in range(50)]
    body = json.dumps(items, ensure_ascii=False).encode()
    for size in (1, 2, 3, 7, 64, len(body)):
        chunks = [body[i : i + size] for i in range(0, len(body), size)]
        assert list(json_array(chunks)) == items
    assert list(json_array([b"[", b"]"])) == []


@pytest.mark.parametrize(
    ("chunks", "why"),
    [
        ([b'[{"Id": "a"}, {"Id": "b'], 'before its closing bracket: \'{"Id": "b\''),
        ([b'{"Id": "a"}]'], "not a JSON array"),
        ([b"[1", b"23]"], "non-object"),
        ([b'[{"Id": "a"}, [{"Id": "b"}]]'], "non-object"),
    ],
)
def test_json_array_refuses_what_is_not_a_whole_listing(chunks, why):
    with pytest.raises(ValueError, match=re.escape(why)):
        list(json_array(chunks))


def test_no_engine_is_an_os_error(tmp_path):
    with pytest.raises(OSError):
        enginehttp.request(
            Endpoint.parse(f"unix://{tmp_path}/none.sock"), "DELETE", "/containers/x", 1.0
        )


class StandIn:
    """One answer to each connection on a unix socket, as given bytes or made from the
    request's path (what no real engine says: garbage, a body cut short, a stream that
    never ends, a listing in small chunks)."""

    def __init__(self, path: Path, answer: bytes | Callable[[str], bytes], hold: bool) -> None:
        self.path, self._hold = str(path), hold
        self.endpoint = Endpoint.parse(f"unix://{path}")
        self._answer = answer if callable(answer) else lambda _: answer
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(self.path)
        self._server.listen(8)
        self.requests: list[bytes] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            with conn:
                self.requests.append(conn.recv(65536))
                conn.sendall(self._answer(self.requests[-1].split()[1].decode()))
                if self._hold:  # until the client goes
                    while conn.recv(4096):
                        pass

    def close(self) -> None:
        self._server.shutdown(socket.SHUT_RDWR)
        self._server.close()
        self._thread.join(5)


@pytest.fixture
def stand_in(tmp_path: Path):
    made: list[StandIn] = []

    def make(answer: bytes | Callable[[str], bytes], hold: bool = False) -> StandIn:
        made.append(StandIn(tmp_path / f"{len(made)}.sock", answer, hold))
        return made[-1]

    yield make
    for server in made:
        server.close()


@pytest.fixture
def sockets(monkeypatch: pytest.MonkeyPatch) -> list[socket.socket]:
    """Every socket the client connects, to see that each is let go."""
    made: list[socket.socket] = []

    class Tracked(enginehttp._Connection):
        def connect(self) -> None:
            super().connect()
            made.append(self.raw)

    monkeypatch.setattr(enginehttp, "_Connection", Tracked)
    return made


def _http(status: str, body: bytes, *head: str) -> bytes:
    lines = [f"HTTP/1.1 {status}", f"Content-Length: {len(body)}", *head, "", ""]
    return "\r\n".join(lines).encode() + body


def _chunked(body: bytes, size: int, *head: str) -> bytes:
    lines = ["HTTP/1.1 200 OK", "Transfer-Encoding: chunked", *head, "", ""]
    chunks = [body[i : i + size] for i in range(0, len(body), size)]
    return "\r\n".join(lines).encode() + b"".join(
        b"%x\r\n%s\r\n" % (len(c), c) for c in [*chunks, b""]
    )


VERSION = _http("200 OK", b'{"ApiVersion": "1.41"}')


def _ping(*head: str) -> bytes:
    """A /_ping's answer that says the API version, as Docker's and podman's do."""
    return _http("200 OK", b"OK", "Api-Version: 1.41", *head)


def test_the_api_version_is_asked_once_and_again_after_close(stand_in) -> None:
    server = stand_in(lambda path: _ping() if path == "/_ping" else _http("200 OK", b"{}"))
    api = Client(server.endpoint, 5.0)
    api.inspect("c")
    api.remove_volume("v")
    api.close()
    api.inspect("c")
    asked = [r.split()[:2] for r in server.requests]
    assert asked == [
        [b"GET", b"/_ping"],
        [b"GET", b"/v1.41/containers/c/json"],
        [b"DELETE", b"/v1.41/volumes/v"],
        [b"GET", b"/_ping"],
        [b"GET", b"/v1.41/containers/c/json"],
    ]


def test_without_the_header_the_api_version_is_versions(stand_in) -> None:
    answers = {"/_ping": _http("200 OK", b"OK"), "/version": VERSION}
    server = stand_in(lambda path: answers.get(path, _http("200 OK", b"{}")))
    Client(server.endpoint, 5.0).inspect("c")
    asked = [r.split()[:2] for r in server.requests]
    assert asked == [
        [b"GET", b"/_ping"],
        [b"GET", b"/version"],
        [b"GET", b"/v1.41/containers/c/json"],
    ]


@pytest.mark.parametrize("head", [(), ("Connection: close",)])
def test_a_listing_in_chunks_is_read_whole_and_every_socket_let_go(stand_in, sockets, head):
    items = [{"Id": str(n), "Names": [f"/c{n}"]} for n in range(300)]
    listing = _chunked(json.dumps(items).encode(), 1000, *head)
    server = stand_in(lambda path: _ping(*head) if path == "/_ping" else listing)
    assert Client(server.endpoint, 5.0).containers("x") == items
    assert len(sockets) == 2 and all(s.fileno() == -1 for s in sockets)


@pytest.mark.parametrize(
    ("failures", "again", "calls", "said"),
    [
        ([errors.EngineRefused(409, "Conflict", "in progress")], (409,), 2, (True, "removed")),
        ([errors.EngineRefused(403, "Forbidden", "busy")], (403,), 2, (True, "removed")),
        ([errors.EngineRefused(400, "Bad Request", "bad")], (409,), 1, (False, "bad (HTTP 400)")),
        ([errors.EngineRefused(301, "Moved", "")], (409,), 1, (False, "301 Moved (HTTP 301)")),
        (
            [errors.EngineRefused(500, "Error", "disk")] * 3,
            (409,),
            3,
            (False, "disk (HTTP 500), after 3 tries"),
        ),
        (
            [ConnectionRefusedError(111, "Connection refused")] * 3,
            (),
            3,
            (False, "Connection refused, after 3 tries"),
        ),
        ([errors.NotFound(404, "Not Found", "No such")], (), 1, (True, "already gone")),
    ],
)
def test_attempt_tries_again_only_what_may_pass(monkeypatch, failures, again, calls, said):
    monkeypatch.setattr(attempts, "RETRY_PAUSE", 0.0)
    left, made = list(failures), []

    def call() -> None:
        made.append(1)
        if left:
            raise left.pop(0)

    assert attempts.attempt(call, again) == said
    assert len(made) == calls


def test_a_refusal_carries_the_engines_status_and_message(stand_in) -> None:
    server = stand_in(_http("500 Internal Server Error", b'{"message": "disk full"}'))
    with pytest.raises(errors.EngineRefused) as caught:
        enginehttp.request(server.endpoint, "DELETE", "/v1.41/volumes/v", 5.0)
    err = caught.value
    assert (err.status, err.message) == (500, "disk full")
    assert not isinstance(err, errors.NotFound)
    assert describe(err) == "disk full (HTTP 500)"
    assert server.requests[0].startswith(b"DELETE /v1.41/volumes/v HTTP/1.1\r\n")


def test_a_404_is_not_found_and_a_redirect_is_no_success(stand_in) -> None:
    gone = stand_in(_http("404 Not Found", b'{"message": "No such container: x"}'))
    with pytest.raises(errors.NotFound, match="No such container"):
        enginehttp.request(gone.endpoint, "DELETE", "/containers/x", 5.0)
    moved = stand_in(_http("301 Moved Permanently", b"", "Location: /x"))
    with pytest.raises(errors.EngineRefused) as caught:
        enginehttp.request(moved.endpoint, "DELETE", "/containers/../x", 5.0)
    assert caught.value.status == 301


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (b"SSH-2.0-OpenSSH_9.2\r\n", "did not answer in HTTP"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{}", "cut short"),
        (b"", "did not answer in HTTP"),
    ],
)
def test_what_is_not_a_whole_http_answer_is_one_os_error(stand_in, answer, why) -> None:
    server = stand_in(answer)
    with pytest.raises(OSError, match=why) as caught:
        enginehttp.request(server.endpoint, "GET", "/_ping", 5.0)
    assert "\n" not in describe(caught.value)


def test_an_engine_without_an_api_version_is_named(stand_in) -> None:
    server = stand_in(_http("200 OK", b'{"Version": "x"}'))
    with pytest.raises(ValueError, match="gave no API version: None"):
        Client(server.endpoint, 5.0).inspect("c")


# An answer that says "close" makes http.client forget the socket: the stream must let it go
# all the same.
HEADS = pytest.mark.parametrize("close", ["", "Connection: close\r\n"])


@HEADS
def test_closing_a_stream_from_another_thread_wakes_its_reader(stand_in, sockets, close) -> None:
    # An events stream with one event, then silence, held open by the engine.
    event = b'{"Action": "create"}\n'
    head = f"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n{close}\r\n"
    server = stand_in(head.encode() + b"%x\r\n%s\r\n" % (len(event), event), hold=True)
    stream = enginehttp.Stream(server.endpoint, "/events", 0.2, endless=True)
    seen: list[object] = []
    failed: list[BaseException] = []

    def read() -> None:
        try:
            seen.extend(stream.objects())
        except OSError as err:  # closed under it mid-chunk: one of the ways it may end
            failed.append(err)

    reader = threading.Thread(target=read)
    reader.start()
    wait_for(lambda: seen, what="the first event")
    # Well past the socket's timeout (0.2 s): the stream waits as long as nothing happens.
    reader.join(0.8)
    assert reader.is_alive() and not failed
    stream.close()
    reader.join(5)
    assert not reader.is_alive()
    assert seen == [{"Action": "create"}]
    assert sockets[0].fileno() == -1  # the reader let it go
    stream.close()  # twice is harmless


@HEADS
def test_a_stream_closed_before_any_read_ends_at_once(stand_in, sockets, close) -> None:
    head = f"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n{close}\r\n"
    server = stand_in(head.encode(), hold=True)
    stream = enginehttp.Stream(server.endpoint, "/events", 0.2, endless=True)
    stream.close()
    assert sockets[0].fileno() == -1
    assert list(stream.objects()) == []


def test_the_agents_modules_import_no_sdk() -> None:
    """The agent, `exitwatch reap` and `run` speak to the engine with http.client alone:
    docker-py, requests and urllib3 cost 0.05 to 0.07 s of CPU and 8 MB at each start
    (docs/design.md, "Containers")."""
    probe = (
        "import sys\n"
        "import exitwatch.cli, exitwatch.service.daemon, exitwatch.run.supervise\n"
        "print(*sorted({'docker', 'requests', 'urllib3', 'setuptools'} & set(sys.modules)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=60,
        env=os.environ | {"PYTHONPATH": str(Path(exitwatch.__file__).parents[1])},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == []
