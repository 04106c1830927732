"""The engine client (engine/client.py over engine/http.py) against the real private
engine: each call the kind makes, its filters, its errors as a removal reads them, and the
events stream, compared with what the docker SDK says of the same engine."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid

import pytest

from exitwatch.contract import LABEL_OWNER
from exitwatch.engine import errors
from exitwatch.engine import http as enginehttp
from exitwatch.engine.client import Client
from exitwatch.engine.url import Endpoint
from exitwatch.kinds.docker.attempts import attempt

from support.agentproc import container, exists
from support.procs import wait_for


@pytest.fixture
def api(engine) -> Client:
    return Client(Endpoint.parse(engine.host), 15.0)


def test_removes_a_running_container(engine, api):
    cid = container(engine, labels={})
    api.remove_container(cid)
    assert not exists(engine, cid)
    assert attempt(lambda: api.remove_container(cid)) == (True, "already gone")


@pytest.mark.parametrize("cid", ["0" * 64, "a b?c"])
def test_a_missing_container_is_not_found(api, cid):
    with pytest.raises(errors.NotFound) as caught:
        api.remove_container(cid)
    assert caught.value.status == 404
    assert "No such container" in caught.value.message


def test_an_engine_refusal_is_a_client_error_not_a_not_found(engine):
    # An API version the engine does not speak: a 400 with its message.
    with pytest.raises(errors.EngineRefused) as caught:
        enginehttp.request(Endpoint.parse(engine.host), "DELETE", "/v0.1/containers/x", 15.0)
    assert 400 <= caught.value.status < 500 and not isinstance(caught.value, errors.NotFound)
    assert caught.value.message


def test_anything_but_success_is_an_error_even_a_redirect(api):
    # The engine's router answers a path that is not clean with a redirect: nothing removed.
    with pytest.raises(errors.EngineRefused) as caught:
        api.remove_container("../x")
    assert not isinstance(caught.value, errors.NotFound)


def test_the_api_version_is_the_engines_own(engine, api):
    cid = container(engine, labels={})
    assert api.inspect(cid) == engine.client.api.inspect_container(cid)
    asked = engine.client.api.version(api_version=False)["ApiVersion"]
    assert api._url("/x") == f"/v{asked}/x"


def test_each_listing_filters_as_the_sdk_does(engine, api):
    mark = f"exitwatch-test-{uuid.uuid4().hex[:8]}"
    label = f"{LABEL_OWNER}={mark}"
    sdk = engine.client.api
    net = sdk.create_network(f"{mark}-net", labels={LABEL_OWNER: mark})["Id"]
    other = sdk.create_network(f"{mark}-other")["Id"]
    vol = sdk.create_volume(f"{mark}-vol", labels={LABEL_OWNER: mark})["Name"]
    sdk.create_volume(f"{mark}-other")
    on_net = sdk.create_container(
        engine.image,
        "sleep infinity",
        labels={LABEL_OWNER: mark},
        host_config=sdk.create_host_config(network_mode=f"{mark}-net", binds=[f"{vol}:/v"]),
    )["Id"]
    sdk.start(on_net)
    container(engine, labels={})
    assert [c["Id"] for c in api.containers(label)] == [on_net]
    assert api.containers(label) == sdk.containers(all=True, filters={"label": label})
    assert [n["Id"] for n in api.networks(label)] == [net]
    assert [v["Name"] for v in api.volumes(label)] == [vol]
    assert api.network(net)["Labels"] == api.volume(vol)["Labels"] == {LABEL_OWNER: mark}
    assert api.network(net) == sdk.inspect_network(net)
    for kind, ident in (("network", net), ("volume", vol)):
        users = api.users(kind, ident)
        assert [c["Id"] for c in users] == [on_net]
        assert users == sdk.containers(all=True, filters={kind: ident})
    assert api.users("network", other) == []
    assert api.volumes(f"{LABEL_OWNER}=nobody-{mark}") == []
    api.remove_container(on_net)
    api.remove_network(net)
    api.remove_volume(vol)
    assert api.networks(label) == api.volumes(label) == []


def test_the_events_stream_follows_and_ends_when_closed(engine, api):
    since = f"{time.time():.9f}"
    events = api.events(since, ("container", "volume"))
    seen: list[dict] = []
    ended = threading.Event()

    def follow() -> None:
        with contextlib.suppress(OSError):  # closed under the reader mid-chunk
            seen.extend(events)
        ended.set()

    reader = threading.Thread(target=follow)
    reader.start()
    try:
        # Only the creates and destroys of the types asked for come, labelled or not; a
        # container's carry its labels, a volume's none (so the kind inspects it).
        cid = container(engine, labels={LABEL_OWNER: "x"})
        vol = engine.client.volumes.create(labels={LABEL_OWNER: "x"}).name
        engine.client.api.remove_container(cid, force=True)
        engine.client.api.remove_volume(vol)
        order = [("create", cid), ("create", vol), ("destroy", cid), ("destroy", vol)]
        wait_for(lambda: [(e["Action"], e["Actor"]["ID"]) for e in seen] == order, what="4")
        assert seen[0]["Actor"]["Attributes"][LABEL_OWNER] == "x"
    finally:
        events.close()
        assert ended.wait(5), "closing the stream did not end its reader"
        reader.join(5)
