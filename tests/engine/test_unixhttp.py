"""The lean DELETE /containers/ID against the real private engine: what it removes, and the
docker-py errors it raises, so that a removal's "already gone" and its retries are as before."""

from __future__ import annotations

import pytest
from docker.errors import APIError, NotFound

from exitwatch.kinds.docker import unixhttp

from support.agentproc import container, exists


def _socket(engine) -> str:
    return engine.host.removeprefix("unix://")


def test_removes_a_running_container(engine):
    cid = container(engine, labels={})
    unixhttp.remove_container(_socket(engine), engine.client.api.api_version, cid, 15.0)
    assert not exists(engine, cid)


@pytest.mark.parametrize("cid", ["0" * 64, "a b?c"])
def test_a_missing_container_is_docker_pys_not_found(engine, cid):
    with pytest.raises(NotFound) as caught:
        unixhttp.remove_container(_socket(engine), engine.client.api.api_version, cid, 15.0)
    assert caught.value.status_code == 404
    assert "No such container" in str(caught.value)


def test_an_engine_refusal_is_docker_pys_api_error(engine):
    # An API version the engine does not speak: a 400 with its message.
    with pytest.raises(APIError) as caught:
        unixhttp.remove_container(_socket(engine), "0.1", "x", 15.0)
    assert caught.value.is_client_error() and not isinstance(caught.value, NotFound)
    assert str(caught.value.status_code) in str(caught.value)


def test_anything_but_success_is_an_error_even_a_redirect(engine):
    # The engine's router answers a path that is not clean with a redirect: nothing removed.
    with pytest.raises(APIError) as caught:
        unixhttp.remove_container(_socket(engine), engine.client.api.api_version, "../x", 15.0)
    assert not isinstance(caught.value, NotFound)
