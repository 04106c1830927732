"""The labelling socket in its pure rules: a socket path too long, the policy of `exitwatch
run`, the budget of creation bodies, and which handler the engine runs
for a request target (proxy/routes.py, read as Go's net/http and gorilla/mux read it).
creation.py's rules are in test_proxy_creation.py; engine/test_proxy_attacks.py tries them
on the real engine."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from exitwatch.proxy.policy import Always
from exitwatch.proxy.reader import Budget
from exitwatch.proxy.routes import Refused, Route, build_target, clean_path, request_path, route
from exitwatch.proxy.server import ProxyError, listen


def test_a_socket_path_too_long_is_one_line(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 100)
    deep.mkdir()
    with pytest.raises(ProxyError, match="too long for a unix socket"):
        listen(str(deep))


def test_the_run_s_policy_is_one_owner_for_every_connection() -> None:
    a, b = socket.socketpair()
    with a, b:
        assert Always("x:1:2").owner_for(a) == Always("x:1:2").owner_for(b) == "x:1:2"


def test_the_budget_makes_a_body_wait_for_its_share_and_no_longer() -> None:
    budget = Budget(total=10)
    got: list[str] = []

    def second() -> None:
        with budget.hold(6):
            got.append("second")

    with budget.hold(6), budget.hold(4):  # what is left fits at once
        waiting = threading.Thread(target=second)
        waiting.start()
        waiting.join(0.2)
        assert waiting.is_alive() and got == []
    waiting.join(10)
    assert got == ["second"]
    with budget.hold(1_000):  # more than the whole: the whole, so it never waits for good
        pass


@pytest.mark.parametrize(
    "target, path",
    [
        ("/containers/create", "/containers/create"),
        ("/containers%2Fcreate?name=a", "/containers/create"),
        ("/containers/creat%65", "/containers/create"),
        ("/v1.41/containers/create?x=%zz", "/v1.41/containers/create"),  # the query is apart
        ("http://docker/v1.41/containers/create", "/v1.41/containers/create"),
        ("HTTP://user@docker:80/volumes/create?a", "/volumes/create"),
        ("x:/volumes/create", "/volumes/create"),  # any scheme, no authority
        ("http://docker?/volumes/create", ""),  # the query starts before any path
        ("http:opaque", ""),
        ("/a%3Fb", "/a?b"),
        ("*", "*"),
        ("containers/create", None),  # neither absolute nor a path
        ("/a%2", None),
        ("/a%g0", None),
    ],
)
def test_request_path_is_go_s_url_path(target: str, path: str | None) -> None:
    assert request_path(target) == path


@pytest.mark.parametrize(
    "path, clean",
    [
        ("", "/"),
        ("/", "/"),
        ("//containers/create", "/containers/create"),
        ("/containers/../containers/create/", "/containers/create/"),
        ("/./a/./b/..", "/a"),
        ("/..", "/"),
        ("*", "/*"),
    ],
)
def test_clean_path_is_gorilla_s(path: str, clean: str) -> None:
    assert clean_path(path) == clean


@pytest.mark.parametrize(
    "method, target, found",
    [
        (b"POST", b"/containers/create", Route.CONTAINER_CREATE),
        (b"POST", b"/v1.41/containers%2Fcreate", Route.CONTAINER_CREATE),
        (b"POST", b"/containers/creat%65", Route.CONTAINER_CREATE),
        (b"POST", b"/v1.41./containers/create", Route.CONTAINER_CREATE),
        (b"POST", b"/v./networks/create", Route.NETWORK_CREATE),  # refused by version, later
        (b"POST", b"http://docker/v1.41/volumes/create", Route.VOLUME_CREATE),
        (b"POST", b"/v1.41/build?t=x", Route.BUILD),
        (b"POST", b"/containers/a/b/attach?stream=1", Route.ATTACH),  # {name:.*}
        (b"POST", b"/exec/abc/start", Route.EXEC_START),
        (b"POST", b"/containers/a%0Ab/attach", Route.OTHER),  # `.` stops at a newline
        (b"POST", b"/containers/create/", Route.OTHER),  # no strict slash: a 404
        (b"POST", b"/v1.41/Containers/create", Route.OTHER),
        (b"POST", b"/v1.41/containers/create%3Fx", Route.OTHER),
        (b"GET", b"/containers/create", Route.OTHER),  # a 405
        (b"post", b"/containers/create", Route.OTHER),  # methods are case-sensitive
        (b"GET", b"//containers/create", Route.OTHER),  # redirected; not POST anyway
        (b"POST", b"/containers/../containers/json", Route.OTHER),  # redirected, no create
        # A start reads a HostConfig body under API versions before 1.24 only.
        (b"POST", b"/v1.23/containers/a/start", Route.LEGACY_START),
        (b"POST", b"/v1.9/containers/a/start", Route.LEGACY_START),  # 9 < 24, as numbers
        (b"POST", b"/v1..5/containers/a/start", Route.LEGACY_START),  # an empty number: 0
        (b"POST", b"/v1.24/containers/a/start", Route.OTHER),
        (b"POST", b"/v1.23.1/containers/a/start", Route.LEGACY_START),
        (b"POST", b"/v2/containers/a/start", Route.OTHER),
        (b"POST", b"/containers/a/start", Route.OTHER),  # the engine's own version
    ],
)
def test_route_is_the_engine_s(method: bytes, target: bytes, found: Route) -> None:
    assert route(method, target) is found


@pytest.mark.parametrize(
    "target",
    [
        b"//containers/create",
        b"/containers/./create",
        b"/v1.41/x/../networks/create",
        b"/volumes/%2E%2E/volumes/create",
        b"/build/.",
    ],
)
def test_a_target_that_becomes_a_creation_once_cleaned_is_refused(target: bytes) -> None:
    with pytest.raises(Refused, match="only once cleaned"):
        route(b"POST", target)


def test_a_target_the_engine_cannot_read_is_refused() -> None:
    with pytest.raises(Refused, match="not one the engine can read"):
        route(b"GET", b"/containers/json%?a=b")
    with pytest.raises(Refused, match="not one the engine can read"):
        route(b"POST", b"containers/create")


@pytest.mark.parametrize(
    "target, sent",
    [
        (b"/build", b"/build?forcerm=1"),
        (b"/v1.41/build?t=x&rm=1", b"/v1.41/build?forcerm=1&t=x&rm=1"),
        # The client's own forcerm goes: moby reads the first value, podman the last, of
        # any key that folds to it once decoded.
        (b"/build?forcerm=0", b"/build?forcerm=1"),
        (
            b"/v4.3.1/libpod/build?t=x&ForceRM=0&force%72m=false&rm=0",
            b"/v4.3.1/libpod/build?forcerm=1&t=x&rm=0",
        ),
        (b"/build?forcermx=0&xforcerm=0", b"/build?forcerm=1&forcermx=0&xforcerm=0"),
        (b"/build?", b"/build?forcerm=1&"),  # an empty part stays, as it came
        (b"/build?rm=", b"/build?forcerm=1&rm="),  # empty: the default, rm
        # Kept by the client's wish, they would be nobody's: removed all the same.
        (b"/build?rm=0", b"/build?forcerm=1&rm=0"),
        (b"/build?t=x&r%6D=False", b"/build?forcerm=1&t=x&r%6D=False"),
        (b"/build?rm=+no+", b"/build?forcerm=1&rm=+no+"),
        (b"/build?rm=0x", b"/build?forcerm=1&rm=0x"),  # not a false the engine knows
        (b"/build?rm=1&rm=0", b"/build?forcerm=1&rm=1&rm=0"),
    ],
)
def test_a_build_removes_its_intermediate_containers_whatever_rm_says(
    target: bytes, sent: bytes
) -> None:
    assert build_target(target) == sent
