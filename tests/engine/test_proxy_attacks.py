"""Requests that the run's socket once passed on unlabelled (issue 18), against the private
engine: each shape is first sent to the engine directly, where it creates an unlabelled
container or volume (so the shape is real, and this test could fail), then through the
socket, where what it creates carries the owner, or it is refused with the socket's own
error answer and nothing is created. Then Expect: 100-continue, and the body limits."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator

import pytest

from exitwatch.contract import LABEL_OWNER
from exitwatch.proxy.policy import Always, Owner, Refuse
from exitwatch.proxy.reader import MAX_BODY

from support.proxying import (
    DEADLINE,
    OWNER,
    config,
    containers,
    exchange,
    post,
    serving,
    volumes,
)


@pytest.fixture
def proxied(engine) -> Iterator[str]:
    """A run's socket: every creation labelled with OWNER."""
    with serving(engine, Always(OWNER)) as path:
        yield path


# Each shape: (how to send it as `name`, how many responses to read, what the socket does).
# The engine creates from each (Docker 20.10 from all); a later one refuses ENGINE_REFUSES.
Shape = tuple[Callable[[str, bytes], bytes], int, str]  # (image, name)

SHAPES: dict[str, Shape] = {
    "percent-encoded slash": (
        lambda i, n: post(b"/v1.41/containers%2Fcreate?name=" + n, config(i)),
        1,
        "labelled",
    ),
    "percent-encoded letter": (
        lambda i, n: post(b"/containers/creat%65?name=" + n, config(i)),
        1,
        "labelled",
    ),
    "version prefix 1.41.": (
        lambda i, n: post(b"/v1.41./containers/create?name=" + n, config(i)),
        1,
        "labelled",
    ),
    "absolute-form target": (
        lambda i, n: post(b"http://docker/v1.41/containers/create?name=" + n, config(i)),
        1,
        "labelled",
    ),
    "trailing data": (
        lambda i, n: post(b"/containers/create?name=" + n, config(i) + b"trailing"),
        1,
        "refused",
    ),
    "two JSON objects": (
        lambda i, n: post(b"/containers/create?name=" + n, config(i) + config(i)),
        1,
        "refused",
    ),
    "case-variant Labels": (
        lambda i, n: post(
            b"/containers/create?name=" + n,
            b'{"Image":"%s","Labels":{},"labels":null}' % i.encode(),
        ),
        1,
        "refused",
    ),
    "long s in Labels": (
        lambda i, n: post(
            b"/containers/create?name=" + n,
            b'{"Image":"%s","Labels":{},"Label\xc5\xbf":null}' % i.encode(),  # a long s
        ),
        1,
        "refused",
    ),
    "invalid UTF-8": (
        lambda i, n: post(b"/containers/create?name=" + n, config(i)[:-1] + b',"X":"\xff"}'),
        1,
        "refused",
    ),
    "after a refused exec start": (
        lambda i, n: (
            post(b"/exec/nosuchexec/start", b'{"Detach":false}', b"Upgrade: tcp")
            + post(b"/containers/create?name=" + n, config(i))
        ),
        2,
        "labelled",
    ),
    "after an Upgrade header": (
        lambda i, n: (
            b"GET /_ping HTTP/1.1\r\nHost: x\r\nUpgrade: tcp\r\nConnection: Upgrade\r\n\r\n"
            + post(b"/containers/create?name=" + n, config(i))
        ),
        2,
        "labelled",
    ),
    # Framings h11 and Go both take, but might read apart: the head written again settles it.
    "after a folded header": (
        lambda i, n: (
            b"GET /_ping HTTP/1.1\r\nHost: x\r\nX-A: a\r\n b\r\n\r\n"
            + post(b"/containers/create?name=" + n, config(i))
        ),
        2,
        "labelled",
    ),
    "after bare LF line ends": (
        lambda i, n: (
            b"GET /_ping HTTP/1.1\nHost: x\n\n" + post(b"/containers/create?name=" + n, config(i))
        ),
        2,
        "labelled",
    ),
    "after Transfer-Encoding and Content-Length both": (
        lambda i, n: (
            b"POST /_ping HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
            + post(b"/containers/create?name=" + n, config(i))
        ),
        2,
        "labelled",
    ),
    "after a request h11 refuses": (
        lambda i, n: (
            b"GET /_ping?x=\xff HTTP/1.1\r\nHost: x\r\n\r\n"
            + post(b"/containers/create?name=" + n, config(i))
        ),
        2,
        "refused",
    ),
}


# Docker 20.10 creates from the first object and ignores the rest; 26.1 (Debian 13's) answers
# 400 "unexpected content after JSON". The socket refuses them before either.
ENGINE_REFUSES = {"trailing data", "two JSON objects"}


@pytest.mark.parametrize("shape", SHAPES)
def test_a_creation_the_engine_reads_is_labelled_or_refused(engine, proxied, shape) -> None:
    make, count, outcome = SHAPES[shape]
    direct = exchange(str(engine.socket), make(engine.image, b"direct"), count)
    if shape in ENGINE_REFUSES and direct[-1][0] == 400:
        assert "direct" not in containers(engine), direct
    else:
        assert direct[-1][0] == 201, direct  # the engine creates from it
        assert LABEL_OWNER not in containers(engine)["direct"]

    through = exchange(proxied, make(engine.image, b"through"), count)
    made = containers(engine)
    if outcome == "labelled":
        assert through[-1][0] == 201, through
        assert made["through"].get(LABEL_OWNER) == OWNER
    else:
        status, body = through[0] if count == 1 or through[0][0] == 400 else through[1]
        assert status == 400 and json.loads(body)["message"].startswith("exitwatch: "), through
        assert "through" not in made
    assert set(made) <= {"direct", "through"}


def test_a_null_volume_body_is_refused_where_the_engine_makes_a_volume(engine, proxied) -> None:
    (direct,) = exchange(str(engine.socket), post(b"/volumes/create", b"null"), 1)
    assert direct[0] == 201 and volumes(engine) == [{}]  # a volume with a random name
    (through,) = exchange(proxied, post(b"/volumes/create", b"null"), 1)
    assert through[0] == 400 and b"exitwatch: the body is a JSON NoneType" in through[1]
    assert volumes(engine) == [{}]


def test_an_empty_creation_body_is_refused(engine, proxied) -> None:
    """dockerd 20.10 refuses it; later versions create a volume of a random name from it."""
    (through,) = exchange(proxied, post(b"/volumes/create", b""), 1)
    assert through[0] == 400 and b"exitwatch: the body is empty" in through[1]
    assert volumes(engine) == []


def test_a_named_volume_the_engine_refuses_refuses_the_create_as_directly(engine, proxied) -> None:
    body = config(engine.image, HostConfig={"Binds": ["bad!name:/d"]})
    (direct,) = exchange(str(engine.socket), post(b"/containers/create", body), 1)
    (through,) = exchange(proxied, post(b"/containers/create", body), 1)
    assert direct[0] == through[0] == 400
    assert (
        b"includes invalid characters" in direct[1] and b"includes invalid characters" in through[1]
    )
    assert json.loads(through[1])["message"].startswith("exitwatch: volume 'bad!name', created")
    assert containers(engine) == {} and volumes(engine) == []


def test_a_refusal_keeps_the_connection_for_the_next_request(engine, proxied) -> None:
    bad = post(b"/containers/create?name=bad", config(engine.image) + b"x")
    good = post(b"/containers/create?name=good", config(engine.image))
    answers = exchange(proxied, bad + good, 2)
    assert [status for status, _ in answers] == [400, 201]
    assert containers(engine) == {"good": {LABEL_OWNER: OWNER}}


def test_a_hijacked_exec_is_raw_both_ways(engine, proxied) -> None:
    """An exec start that the engine does hijack: what follows is the stream, not HTTP."""
    api = engine.client.api
    cid = api.create_container(engine.image, ["sleep", "1000"])["Id"]
    api.start(cid)
    eid = api.exec_create(cid, ["cat"], stdin=True)["Id"]
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(DEADLINE)
        s.connect(proxied)
        # A create, as stdin: the engine takes it for the stream, so the proxy must too.
        s.sendall(
            post(b"/exec/%s/start" % eid.encode(), b'{"Detach":false}', b"Upgrade: tcp")
            + post(b"/containers/create?name=instream", config(engine.image))
        )
        s.shutdown(socket.SHUT_WR)
        got = b""
        while chunk := s.recv(65536):
            got += chunk
    head, _, stream = got.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 101 UPGRADED\r\n")
    assert demux(stream) == post(b"/containers/create?name=instream", config(engine.image))
    assert "instream" not in containers(engine)


def demux(data: bytes) -> bytes:
    """The payload of a multiplexed stream."""
    out = b""
    while data:
        size = int.from_bytes(data[4:8], "big")
        out, data = out + data[8 : 8 + size], data[8 + size :]
    return out


# -- the other answers a policy may give ------------------------------------------------------


class Fixed:
    def __init__(self, owner: Owner) -> None:
        self.owner = owner

    def owner_for(self, client: socket.socket) -> Owner:
        return self.owner


def test_a_connection_that_is_nobody_s_passes_through_untouched(engine) -> None:
    with serving(engine, Fixed(None)) as path:
        (answer,) = exchange(path, post(b"/containers/create?name=free", config(engine.image)), 1)
    assert answer[0] == 201
    assert containers(engine) == {"free": {}}


def test_a_connection_of_an_unknown_owner_has_only_its_creations_refused(engine) -> None:
    with serving(engine, Fixed(Refuse("its process is gone"))) as path:
        ping = b"GET /_ping HTTP/1.1\r\nHost: x\r\n\r\n"
        answers = exchange(path, ping + post(b"/volumes/create", b"{}") + ping, 3)
    assert [status for status, _ in answers] == [200, 400]  # and the connection closed
    message = json.loads(answers[1][1])["message"]
    assert message == "exitwatch: creations are refused here: its process is gone"
    assert volumes(engine) == []


# -- Expect: 100-continue ----------------------------------------------------------------------


def test_expect_100_continue_on_a_creation_is_answered(engine, proxied) -> None:
    body = config(engine.image)
    head = post(b"/containers/create?name=NAME", b"", b"Expect: 100-continue")
    head = head.replace(b"Content-Length: 0", b"Content-Length: %d" % len(body))
    for path, name in [(str(engine.socket), b"direct"), (proxied, b"through")]:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(DEADLINE)
            s.connect(path)
            s.sendall(head.replace(b"NAME", name))
            # A client that waits for the 100 before it sends the body.
            assert s.recv(65536) == b"HTTP/1.1 100 Continue\r\n\r\n"
            s.sendall(body)
            assert s.recv(65536).startswith(b"HTTP/1.1 201 Created\r\n")
    assert containers(engine)["through"] == {LABEL_OWNER: OWNER}


def curl(path: str, *args: str) -> subprocess.CompletedProcess[str]:
    # curl waits this long for the 100 before it sends the body anyway: a missing 100 then
    # shows as the run's timeout, not as a second's delay.
    return subprocess.run(
        ["curl", "-sS", "--expect100-timeout", "60", "--unix-socket", path, *args],
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )


def test_curl_with_expect_100_continue_through_the_socket_as_directly(
    engine, proxied, tmp_path
) -> None:
    if not shutil.which("curl"):
        pytest.skip("curl is not installed")
    body = tmp_path / "body.json"
    body.write_bytes(config(engine.image))
    tar = tmp_path / "f.tar"
    subprocess.run(["tar", "-cf", tar, "-C", "/etc", "hostname"], check=True)
    cid = engine.client.api.create_container(engine.image, ["true"])["Id"]
    for path, name in [(str(engine.socket), "direct"), (proxied, "through")]:
        created = curl(
            path,
            "-H",
            "Expect: 100-continue",
            "-H",
            "Content-Type: application/json",
            "--data-binary",
            f"@{body}",
            f"http://docker/containers/create?name={name}",
        )
        assert created.returncode == 0 and '"Id"' in created.stdout, created
        # A body the socket passes raw: the engine's own 100 comes through.
        put = curl(
            path,
            "-w",
            "%{http_code}",
            "-H",
            "Expect: 100-continue",
            "-T",
            str(tar),
            f"http://docker/containers/{cid}/archive?path=/",
        )
        assert put.stdout == "200", put
    assert containers(engine)["through"] == {LABEL_OWNER: OWNER}


# -- the body limits ---------------------------------------------------------------------------


def padded(image: str, size: int) -> bytes:
    """A container create of exactly `size` bytes (a long environment)."""
    empty = config(image, Env=[])
    fill = size - len(empty) - 2  # the quotes around the one variable
    body = config(image, Env=["P=" + "x" * (fill - 2)])
    assert len(body) == size
    return body


def test_a_body_at_the_limit_is_labelled(engine, proxied) -> None:
    (answer,) = exchange(
        proxied, post(b"/containers/create?name=big", padded(engine.image, MAX_BODY)), 1
    )
    assert answer[0] == 201, answer
    assert containers(engine)["big"] == {LABEL_OWNER: OWNER}


@pytest.mark.parametrize("chunked", [False, True])
def test_a_body_over_the_limit_is_refused_and_the_engine_gets_nothing(
    engine, proxied, chunked
) -> None:
    body = padded(engine.image, MAX_BODY + 1)
    if chunked:
        chunks = b"".join(
            b"%x\r\n%s\r\n" % (len(body[i : i + 65536]), body[i : i + 65536])
            for i in range(0, len(body), 65536)
        )
        data = post(b"/containers/create?name=over", b"")
        data = (
            data.replace(b"Content-Length: 0", b"Transfer-Encoding: chunked")
            + chunks
            + b"0\r\n\r\n"
        )
    else:
        data = post(b"/containers/create?name=over", body)
    since = time.time()
    (answer,) = exchange(proxied, data, 1)
    assert answer[0] == 413
    message = json.loads(answer[1])["message"]
    assert message.startswith("exitwatch: a creation's body of ") and str(MAX_BODY) in message
    assert "over" not in containers(engine)
    events = engine.client.api.events(since=since, until=time.time(), decode=True)
    assert [
        e for e in events if e.get("Actor", {}).get("Attributes", {}).get("name") == "over"
    ] == []
