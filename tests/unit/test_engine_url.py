"""The engine URL's rules, read once (engine/url.py) for the agent's kind, `exitwatch run`
and `exitwatch adopt`: which schemes, the default, DOCKER_HOST, and the one error."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from exitwatch.engine import url
from exitwatch.engine.url import DEFAULT_URL, Endpoint, EndpointError, chosen
from exitwatch.kinds.docker.kind import Containers


def test_a_unix_url_names_its_socket_as_docker_py_reads_it() -> None:
    assert Endpoint.parse("unix:///run/docker.sock").where == "/run/docker.sock"
    assert Endpoint.parse("unix://var/run/docker.sock").where == "/var/run/docker.sock"
    assert Endpoint.parse(" unix:///run/x.sock ").where == "/run/x.sock"
    # As given, for status and messages.
    assert str(Endpoint.parse("unix://var/run/docker.sock")) == "unix://var/run/docker.sock"


def test_a_setting_then_docker_host_then_the_default() -> None:
    env = {"DOCKER_HOST": " unix:///run/env.sock "}
    assert chosen("unix:///a.sock", "unix:///b.sock", env=env).where == "/a.sock"
    assert chosen(None, "", "unix:///b.sock", env=env).where == "/b.sock"
    assert chosen(None, env=env).where == "/run/env.sock"
    assert chosen(env={}).url == DEFAULT_URL
    assert chosen(env={"DOCKER_HOST": "  "}).where == "/var/run/docker.sock"
    assert Containers("unix:///run/x.sock").host == "unix:///run/x.sock"


@pytest.mark.parametrize(
    "given",
    ["tcp://127.0.0.1:2375", "ssh://me@host", "unix://", "/run/docker.sock", "npipe:////./pipe/x"],
)
def test_what_is_not_a_local_socket_is_one_error_saying_what_to_give(given: str) -> None:
    with pytest.raises(EndpointError) as caught:
        Endpoint.parse(given)
    said = str(caught.value)
    assert "\n" not in said and said.endswith(f", got {given!r}")
    assert "unix://" in said and DEFAULT_URL in said and "tcp:// or ssh://" in said
    assert not url.valid(given)
    with pytest.raises(EndpointError, match="expected a local engine's unix:// socket"):
        chosen(env={"DOCKER_HOST": given})
    with pytest.raises(EndpointError):
        Containers(given)


def test_an_endpoint_connects_and_says_when_nothing_listens(tmp_path: Path) -> None:
    where = tmp_path / "e.sock"
    endpoint = Endpoint.parse(url.served(str(where)))
    with pytest.raises(FileNotFoundError):
        endpoint.connect(1.0)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(where))
        server.listen(1)
        with endpoint.connect(1.0) as conn:
            accepted, _ = server.accept()
            with accepted:
                conn.sendall(b"x")
                assert accepted.recv(1) == b"x"
            assert conn.gettimeout() == 1.0 and not conn.get_inheritable()
        assert endpoint.stat().st_ino == where.stat().st_ino
