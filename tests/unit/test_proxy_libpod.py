"""Podman's own API (libpod) through the labelling proxy: which of its requests create
(routes.py), how their bodies are labelled (creation.py), what is refused, and how
CONTAINER_HOST is read (engine/url.py). engine/test_run_podman.py drives the podman CLI
through the proxies against a real podman service."""

from __future__ import annotations

import json

import pytest

from exitwatch.contract import LABEL_KEEP, LABEL_OWNER
from exitwatch.engine import url
from exitwatch.proxy import creation
from exitwatch.proxy.creation import Volume, label
from exitwatch.proxy.routes import Refused, Route, route

OWNER = "b:1:2"
OURS = {LABEL_OWNER: OWNER}
SOMEONE = "0b8c7a3e-3d4c-4b8e-9f1a-2c3d4e5f6a7b:1234:5678"  # a well-formed owner


@pytest.mark.parametrize(
    "target, found",
    [
        (b"/v4.3.1/libpod/containers/create", Route.POD_CONTAINER_CREATE),
        (b"/libpod/containers/create", Route.POD_CONTAINER_CREATE),  # a 404 on 4.3: labelled
        (b"/v5.4.2/libpod/pods/create", Route.POD_CREATE),
        (b"/v4.3.1/libpod/networks/create", Route.POD_NETWORK_CREATE),
        (b"/v4.3.1/libpod/volumes/create", Route.POD_VOLUME_CREATE),
        (b"/v4.3.1/libpod/build?t=x", Route.BUILD),
        (b"/v4.3.1/libpod/containers/abc/attach?stream=true", Route.ATTACH),
        (b"/v4.3.1/libpod/exec/abc/start", Route.EXEC_START),
        # podman's prefix is [0-9][0-9A-Za-z.-]*, moby's [0-9.]+: either engine's is read,
        # and on podman a /v1.41-x/containers/create is its Docker API's create.
        (b"/v1.41-x/containers/create", Route.CONTAINER_CREATE),
        (b"/v4.3.1-dev/libpod/containers/create", Route.POD_CONTAINER_CREATE),
        (b"/v4abc/libpod/volumes/create", Route.POD_VOLUME_CREATE),
        (b"/v4.3.1/libpod/containers/create/", Route.OTHER),  # no strict slash: a 404
        (b"/v4.3.1/libpod/commit?container=x", Route.OTHER),  # an image
        (b"/v4.3.1/libpod/containers/abc/restore", Route.OTHER),  # in place: no new one
        (b"/v4.3.1/libpod/containers/abc/restore?keep=true", Route.OTHER),
        # What the CLI sends for a restore in place: name= always, import never.
        (b"/v4.3.1/libpod/containers/abc/restore?fileLocks=false&name=&keep=false", Route.OTHER),
        (b"/v4.3.1/libpod/containers/abc/restore?import=false&Import=0&import=", Route.OTHER),
        (b"/v4.3.1/libpod/containers/abc/exec", Route.OTHER),  # an exec session
    ],
)
def test_podman_s_routes(target: bytes, found: Route) -> None:
    assert route(b"POST", target) is found


@pytest.mark.parametrize(
    "target, why",
    [
        (b"/v4.3.1/libpod/play/kube", "kube play is refused"),
        (b"/v4.3.1/libpod/kube/play?network=x", "kube play is refused"),
        (b"/libpod/play/kube", "kube play is refused"),
        (b"/v5.4.2/libpod/kube/apply", "kube apply is refused"),
        (b"/v4.3.1/libpod/containers/x/restore?import=true", "restore --import is refused"),
        (b"/v4.3.1/libpod/containers/x/restore?Import=1", "restore --import"),  # schema folds
        (b"/v4.3.1/libpod/containers/x/restore?%69mport=true", "restore --import"),
        (b"/v4.3.1/libpod/containers/x/restore?import=on", "restore --import"),  # schema's
        (b"/v4.3.1/libpod/containers/x/restore?import=false&import=t", "restore --import"),
        (b"/v4.3.1/libpod/containers/x/restore?import=yes", "restore --import"),  # unread: 400
        (b"/v4.3.1/libpod/x/../play/kube", "kube play is refused"),  # cleaned first
    ],
)
def test_what_podman_makes_unlabelled_is_refused(target: bytes, why: str) -> None:
    with pytest.raises(Refused, match=why):
        route(b"POST", target)
    assert route(b"GET", target.split(b"?")[0].replace(b"/../", b"/")) is Route.OTHER


def _labelled(found: Route, doc: dict) -> tuple[dict, tuple[Volume, ...]]:
    done = label(found, json.dumps(doc).encode(), OWNER)
    return json.loads(done.body), done.volumes


def test_a_podman_container_is_labelled_with_its_named_volumes_made_first() -> None:
    doc = {
        "image": "x",
        "labels": {"a": "b"},
        "volumes": [
            {"Name": "data", "Dest": "/d", "Options": ["ro"]},
            {"Name": "", "Dest": "/anon"},  # anonymous: it goes with its container
            {"Name": "data", "Dest": "/again"},
        ],
        "mounts": [{"destination": "/b", "type": "bind", "source": "/tmp"}],
    }
    body, volumes = _labelled(Route.POD_CONTAINER_CREATE, doc)
    assert body == {**doc, "labels": {"a": "b", **OURS}}
    assert volumes == (Volume("data", labels=OURS),)


def test_a_podman_pod_network_and_volume_are_labelled() -> None:
    body, volumes = _labelled(Route.POD_CREATE, {"name": "p", "volumes": [{"Name": "v"}]})
    assert body["labels"] == OURS and volumes == (Volume("v", labels=OURS),)
    body, volumes = _labelled(Route.POD_NETWORK_CREATE, {"name": "n", "labels": None})
    assert body["labels"] == OURS and volumes == ()
    # A volume's labels are its Label and Labels, the latter winning (podman 4.3 and 5.4).
    body, _ = _labelled(Route.POD_VOLUME_CREATE, {"Name": "v", "Label": {"a": "1", "b": "1"}})
    assert body == {"Name": "v", "Label": {"a": "1", "b": "1"}, "Labels": OURS}
    body, _ = _labelled(Route.POD_VOLUME_CREATE, {"Label": {"a": "1"}, "Labels": {"b": "2"}})
    assert body["Labels"] == {"b": "2", **OURS}


@pytest.mark.parametrize(
    "found, doc",
    [
        (
            Route.POD_CONTAINER_CREATE,
            {"labels": {LABEL_OWNER: SOMEONE}, "volumes": [{"Name": "v"}]},
        ),
        (Route.POD_CREATE, {"labels": {LABEL_KEEP: "true"}}),
        (Route.POD_NETWORK_CREATE, {"labels": {LABEL_OWNER: SOMEONE}}),
        (Route.POD_VOLUME_CREATE, {"Label": {LABEL_OWNER: SOMEONE}}),  # Label counts too
        (Route.POD_VOLUME_CREATE, {"Labels": {LABEL_KEEP: "true"}}),
    ],
)
def test_a_podman_body_with_an_owner_or_asking_to_be_kept_passes_as_it_came(
    found: Route, doc: dict
) -> None:
    body = json.dumps(doc).encode()
    done = label(found, body, OWNER)
    assert done.body == body and done.volumes == ()


@pytest.mark.parametrize(
    "found, body, why",
    [
        # Go's encoding/json reads a key as the field whatever its case.
        (Route.POD_CONTAINER_CREATE, b'{"Labels": {"a": "b"}}', "as its field 'labels'"),
        (Route.POD_CREATE, b'{"labels": {}, "LABELS": {}}', "as its field 'labels'"),
        (Route.POD_VOLUME_CREATE, b'{"labels": {"a": "b"}}', "as its field 'Labels'"),
        (Route.POD_VOLUME_CREATE, b'{"label": {"a": "b"}}', "as its field 'Label'"),
        (Route.POD_CONTAINER_CREATE, b'{"volumes": [{"name": "v"}]}', "as its field 'Name'"),
        (Route.POD_CONTAINER_CREATE, b'{"volumes": {"Name": "v"}}', "not a list"),
        (Route.POD_NETWORK_CREATE, b'{"labels": {"a": 1}}', "not a string"),
        (Route.POD_CREATE, b'{"labels": {}} {"labels": {}}', "goes on after"),
    ],
)
def test_a_podman_body_the_engine_may_read_otherwise_is_refused(
    found: Route, body: bytes, why: str
) -> None:
    with pytest.raises(creation.Refused, match=why):
        label(found, body, OWNER)


@pytest.mark.parametrize(
    "given, where",
    [
        ("unix:///run/podman/podman.sock", "/run/podman/podman.sock"),
        ("unix://run/podman/podman.sock", "/run/podman/podman.sock"),  # podman joins them
        ("unix:/run/podman/podman.sock", "/run/podman/podman.sock"),
        (" unix:///x.sock ", "/x.sock"),
    ],
)
def test_container_host_is_read_as_podman_reads_it(given: str, where: str) -> None:
    found = url.podman({"CONTAINER_HOST": given})
    assert found is not None and found.where == where
    assert url.Endpoint.parse(found.url).where == where  # what the run's cleanup is given


@pytest.mark.parametrize(
    "given",
    ["ssh://core@host:22/run/podman/podman.sock", "tcp://127.0.0.1:8080", "unix:x.sock", "unix:"],
)
def test_a_container_host_of_another_host_is_one_line(given: str) -> None:
    with pytest.raises(url.EndpointError) as err:
        url.podman({"CONTAINER_HOST": given})
    assert "\n" not in str(err.value) and "CONTAINER_HOST" in str(err.value)


def test_no_container_host_is_no_podman() -> None:
    assert url.podman({}) is None
    assert url.podman({"CONTAINER_HOST": ""}) is None


def test_a_podman_owner_label_that_names_nobody_is_replaced() -> None:
    body, _ = _labelled(Route.POD_VOLUME_CREATE, {"Label": {LABEL_OWNER: "nobody"}})
    assert body["Labels"] == OURS  # Labels wins over Label: the owner is the run's
