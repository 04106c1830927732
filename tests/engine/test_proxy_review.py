"""The second review of the run's socket, each attack against the private engine: named
volumes made through the legacy fields of a container create and through an old API's
container start (sent to the engine directly first, where they are made unlabelled, so the
shape is real), creations that held the body budget while their clients sent nothing, a
response head past what the socket reads, and a hijack answered inside a chunked body (by
Docker 20.10; from 23 the engine reads such a body to its end before it hijacks)."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator

import pytest

from exitwatch.contract import LABEL_OWNER
from exitwatch.proxy.policy import Always
from exitwatch.proxy.reader import BODY_DEADLINE, MAX_BODY

from support.proxying import DEADLINE, OWNER, config, containers, exchange, post, serving


@pytest.fixture
def proxied(engine) -> Iterator[str]:
    with serving(engine, Always(OWNER)) as path:
        yield path


def volume_labels(engine) -> dict[str, dict]:
    found = engine.client.api.volumes()["Volumes"] or []
    return {v["Name"]: v.get("Labels") or {} for v in found}


# -- F1: HostConfig's fields at the top of a container create ---------------------------------

LEGACY: dict[str, Callable[[str, str], dict]] = {
    "Binds, no HostConfig": lambda i, v: {"Binds": [f"{v}:/data"]},
    "Binds, a null HostConfig": lambda i, v: {"Binds": [f"{v}:/data"], "HostConfig": None},
    "Mounts, no HostConfig": lambda i, v: {
        "Mounts": [{"Type": "volume", "Source": v, "Target": "/d"}]
    },
}


@pytest.mark.parametrize("shape", LEGACY)
def test_a_volume_named_at_the_top_of_a_create_is_labelled(engine, proxied, shape) -> None:
    for path, name in [(str(engine.socket), "direct"), (proxied, "through")]:
        body = config(engine.image, **LEGACY[shape](engine.image, f"vol-{name}"))
        (answer,) = exchange(path, post(b"/v1.41/containers/create?name=" + name.encode(), body), 1)
        assert answer[0] == 201, answer
    made = volume_labels(engine)
    assert made["vol-direct"] == {}  # the engine makes it from the top's fields
    assert made["vol-through"] == {LABEL_OWNER: OWNER}
    assert containers(engine)["through"] == {LABEL_OWNER: OWNER}


# -- F2: a container start under API 1.23, with a HostConfig -----------------------------------


@pytest.mark.parametrize("inner", [False, True], ids=["HostConfig", "within HostConfig"])
def test_a_volume_named_by_an_old_api_s_start_is_labelled(engine, proxied, inner) -> None:
    """The engine reads a start's body as it reads a create's: a HostConfig's fields, at
    the top or within a "HostConfig". Docker 25 and later serve no API below 1.24: there
    the socket answers as the engine does, and the engine makes nothing."""
    served = _version(engine.client.version()["MinAPIVersion"]) <= (1, 23)
    answered = {}
    for path, name in [(str(engine.socket), b"direct"), (proxied, b"through")]:
        create = post(b"/v1.23/containers/create?name=" + name, config(engine.image))
        host = {"Binds": [f"vol-{name.decode()}:/data"]}
        host = json.dumps({"HostConfig": host} if inner else host).encode()
        start = post(b"/v1.23/containers/%s/start" % name, host)
        answers = exchange(path, create + start, 2)
        assert [status for status, _ in answers] == ([201, 204] if served else [400, 400]), answers
        answered[name] = [json.loads(body) if body else None for _, body in answers]
    made = volume_labels(engine)
    if served:
        assert made["vol-direct"] == {}
        assert made["vol-through"] == {LABEL_OWNER: OWNER}
    else:
        assert answered[b"through"] == answered[b"direct"], answered
        assert "too old" in answered[b"direct"][0]["message"]
        # The socket makes a named volume before it passes a creation on; one the engine
        # then refuses leaves it, labelled, to go with the run (docs/run.md).
        assert "vol-direct" not in made
        assert made.get("vol-through", {LABEL_OWNER: OWNER}) == {LABEL_OWNER: OWNER}


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def test_a_start_body_of_a_current_api_is_the_engine_s_to_refuse(engine, proxied) -> None:
    create = post(b"/containers/create?name=cur", config(engine.image))
    start = post(b"/v1.24/containers/cur/start", json.dumps({"Binds": ["v:/d"]}).encode())
    answers = exchange(proxied, create + start, 2)
    assert answers[0][0] == 201 and answers[1][0] == 400
    assert not json.loads(answers[1][1])["message"].startswith("exitwatch")
    assert volume_labels(engine) == {}


# -- F3: the body budget is held only while a body comes ---------------------------------------


def waiting_create(path: str, before: bytes = b"") -> socket.socket:
    """A connection that asks to create with a body at the limit, after `before`, and then
    sends nothing more."""
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(DEADLINE)
    s.connect(path)
    head = post(b"/containers/create", b"", b"Expect: 100-continue")
    s.sendall(before + head.replace(b"Content-Length: 0", b"Content-Length: %d" % MAX_BODY))
    return s


def timed_create(engine, path: str, name: bytes) -> float:
    since = time.monotonic()
    (answer,) = exchange(path, post(b"/containers/create?name=" + name, config(engine.image)), 1)
    assert answer[0] == 201, answer
    return time.monotonic() - since


def test_creates_behind_an_endless_response_hold_no_budget(engine, proxied) -> None:
    """Two creates at the limit, each pipelined behind GET /events, which never ends."""
    hogs = [waiting_create(proxied, b"GET /events HTTP/1.1\r\nHost: x\r\n\r\n") for _ in range(2)]
    try:
        for hog in hogs:  # the events stream has begun: the create behind it is read
            assert hog.recv(65536).startswith(b"HTTP/1.1 200 OK\r\n")
        assert timed_create(engine, proxied, b"third") < BODY_DEADLINE / 2
    finally:
        for hog in hogs:
            hog.close()


def test_creates_whose_bodies_do_not_come_hold_no_budget(engine, proxied) -> None:
    """Two creates at the limit that were sent their 100 Continue, and send no body."""
    hogs = [waiting_create(proxied) for _ in range(2)]
    try:
        for hog in hogs:
            assert hog.recv(65536) == b"HTTP/1.1 100 Continue\r\n\r\n"
        assert timed_create(engine, proxied, b"third") < BODY_DEADLINE / 2
        for hog in hogs:  # and each is answered once its deadline has passed
            assert hog.recv(65536).startswith(b"HTTP/1.1 408 Request Timeout\r\n")
    finally:
        for hog in hogs:
            hog.close()


# -- F6: a response the socket cannot read ends the connection ---------------------------------


def test_a_response_head_past_the_socket_s_limit_ends_the_connection(engine, proxied) -> None:
    """A redirect whose Location, the path escaped, is longer than any head the socket reads:
    it passes on as it came, and the connection then ends rather than hangs."""
    redirected = b"GET /a/../" + b'"' * 400_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n"
    ping = b"GET /_ping HTTP/1.1\r\nHost: x\r\n\r\n"
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(DEADLINE)
        s.connect(proxied)
        s.sendall(redirected + ping)
        got = b""
        while chunk := s.recv(1 << 20):  # a hang fails here, with the timeout
            got += chunk
    assert got.startswith(b"HTTP/1.1 301 Moved Permanently\r\n")
    assert len(got) > 1_200_000  # the Location whole


# -- F10: a hijack answered while a chunked body is still coming (20.10) ----------------------


def test_stdin_after_a_hijack_inside_a_chunked_exec_start_reaches_the_exec(engine, proxied) -> None:
    """Docker 20.10 decodes an exec start's JSON from the first chunk and hijacks at once:
    the client's bytes from then on are the exec's stdin, as they are directly. From 23 (API
    1.42) the engine reads the body to its end first (it checks that nothing follows the
    JSON), so the client ends the body before the hijack, through either socket alike."""
    api = engine.client.api
    whole_body = _version(engine.client.version()["ApiVersion"]) >= (1, 42)
    cid = api.create_container(engine.image, ["sleep", "1000"])["Id"]
    api.start(cid)
    for path in (str(engine.socket), proxied):
        eid = api.exec_create(cid, ["cat"], stdin=True)["Id"]
        body = b'{"Detach":false}'
        head = post(b"/exec/%s/start" % eid.encode(), b"", b"Upgrade: tcp")
        head = head.replace(b"Content-Length: 0", b"Transfer-Encoding: chunked")
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(DEADLINE)
            s.connect(path)
            end = b"0\r\n\r\n" if whole_body else b""
            s.sendall(head + b"%x\r\n%s\r\n" % (len(body), body) + end)
            got = b""
            while b"\r\n\r\n" not in got:
                got += s.recv(65536)
            assert got.startswith(b"HTTP/1.1 101 UPGRADED\r\n"), (path, got)
            s.sendall(b"hello\n")
            s.shutdown(socket.SHUT_WR)
            while chunk := s.recv(65536):
                got += chunk
        assert demux(got.partition(b"\r\n\r\n")[2]) == b"hello\n", path


def demux(data: bytes) -> bytes:
    out = b""
    while data:
        size = int.from_bytes(data[4:8], "big")
        out, data = out + data[8 : 8 + size], data[8 + size :]
    return out


# -- hardening ---------------------------------------------------------------------------------


def test_an_http_1_0_request_with_a_chunked_body_is_refused(engine, proxied) -> None:
    """Go reads no Transfer-Encoding on HTTP/1.0: the engine would take the chunks for
    requests, which the socket would not have read as such."""
    data = (
        b"POST /containers/prune HTTP/1.0\r\nHost: d\r\nConnection: keep-alive\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
    )
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(DEADLINE)
        s.connect(proxied)
        s.sendall(data)
        got = b""
        while chunk := s.recv(65536):
            got += chunk
    head, _, body = got.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 Bad Request\r\n")
    assert json.loads(body)["message"] == "exitwatch: an HTTP/1.0 request with a chunked body"
