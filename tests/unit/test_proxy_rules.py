"""The run's socket (exitwatch.runner.proxy) in its pure rules: what it labels and what it
leaves alone, which engine it fronts, and a socket path too long. engine/test_proxy.py
proves the socket transparent in front of the private engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exitwatch.contract import LABEL_KEEP, LABEL_OWNER
from exitwatch.owner import owner_of
from exitwatch.runner.proxy import ProxyError, engine_path, label, listen

OWNER = str(owner_of())


def test_label_adds_the_owner_and_keeps_the_rest() -> None:
    body = json.dumps({"Image": "x", "Labels": {"a": "b"}}).encode()
    assert json.loads(label(body, OWNER)) == {
        "Image": "x",
        "Labels": {"a": "b", LABEL_OWNER: OWNER},
    }
    assert json.loads(label(b'{"Name": "n", "Labels": null}', OWNER))["Labels"] == {
        LABEL_OWNER: OWNER
    }
    assert json.loads(label(b'{"Name": "n"}', OWNER))["Labels"] == {LABEL_OWNER: OWNER}


@pytest.mark.parametrize(
    "body",
    [
        json.dumps({"Labels": {LABEL_OWNER: "someone else"}}).encode(),
        json.dumps({"Labels": {LABEL_KEEP: "True"}}).encode(),
        b"[1, 2]",
        b"not json",
        b"",
        b'{"Labels": "a string"}',
    ],
)
def test_label_leaves_alone_what_it_must(body: bytes) -> None:
    assert label(body, OWNER) == body


def test_engine_path() -> None:
    assert engine_path({}) == "/var/run/docker.sock"
    assert engine_path({"DOCKER_HOST": "unix:///run/x.sock"}) == "/run/x.sock"
    for host in ("tcp://127.0.0.1:2375", "ssh://me@host", "unix://"):
        with pytest.raises(ProxyError, match="only an engine on a unix socket"):
            engine_path({"DOCKER_HOST": host})


def test_a_socket_path_too_long_is_one_line(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 100)
    deep.mkdir()
    with pytest.raises(ProxyError, match="too long for a unix socket"):
        listen(str(deep))
