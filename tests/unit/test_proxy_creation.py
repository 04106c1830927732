"""The owner label on a creation's body (proxy/creation.py): added where the engine will read
it, the body refused wherever the proxy cannot be sure the engine reads it as Python's json
does, and the named volumes a container create would make the engine create unlabelled.
engine/test_proxy_attacks.py sends such bodies to the real engine."""

from __future__ import annotations

import json

import pytest

from exitwatch.contract import LABEL_KEEP, LABEL_OWNER
from exitwatch.proxy.creation import MAX_VALUES, Refused, Volume, label
from exitwatch.proxy.routes import Route

OWNER = "b:1:2"
CONTAINER, NETWORK, VOLUME = Route.CONTAINER_CREATE, Route.NETWORK_CREATE, Route.VOLUME_CREATE


def labelled(body: bytes, route: Route = CONTAINER) -> dict:
    return json.loads(label(route, body, OWNER).body)


def test_the_owner_is_added_and_the_rest_kept_in_order() -> None:
    body = json.dumps({"Image": "x", "Labels": {"a": "b"}, "Cmd": ["true"]}).encode()
    doc = labelled(body)
    assert doc == {"Image": "x", "Labels": {"a": "b", LABEL_OWNER: OWNER}, "Cmd": ["true"]}
    assert list(doc) == ["Image", "Labels", "Cmd"]
    assert labelled(b'{"Name": "n", "Labels": null}', NETWORK)["Labels"] == {LABEL_OWNER: OWNER}
    assert labelled(b' {"Name": "n"}\n', VOLUME)["Labels"] == {LABEL_OWNER: OWNER}


def test_what_python_and_go_both_read_alike_survives_the_round_trip() -> None:
    body = '{"Env":["A=\\u00e9","B=é","C=\\ud800"],"N":1.5,"M":12345678901234567890}'
    doc = labelled(body.encode())
    assert doc["Env"] == ["A=é", "B=é", "C=\ud800"]  # Go reads the lone surrogate as U+FFFD
    assert doc["N"] == 1.5 and doc["M"] == 12345678901234567890


def test_a_body_of_as_many_values_as_the_proxy_reads_is_labelled() -> None:
    body = b'{"Env": [%s]}' % b",".join([b'""'] * (MAX_VALUES - 1))
    assert len(labelled(body)["Env"]) == MAX_VALUES - 1


SOMEONE = "0b8c7a3e-3d4c-4b8e-9f1a-2c3d4e5f6a7b:1234:5678"


@pytest.mark.parametrize(
    "labels", [{LABEL_OWNER: SOMEONE}, {LABEL_KEEP: "True"}, {LABEL_KEEP: " true "}]
)
def test_a_body_with_an_owner_or_asking_to_be_kept_passes_as_it_came(labels: dict) -> None:
    body = json.dumps({"Labels": labels, "HostConfig": {"Binds": ["v:/d"]}}).encode() + b" "
    done = label(CONTAINER, body, OWNER)
    assert done.body == body and done.volumes == ()


@pytest.mark.parametrize("bad", ["", " ", "someone else", "b:1:2", SOMEONE + " ", "x" * 300])
@pytest.mark.parametrize("route", [CONTAINER, NETWORK, VOLUME])
def test_an_owner_label_that_names_nobody_is_replaced(bad: str, route: Route) -> None:
    # compose's `exitwatch.owner: "${EXITWATCH_OWNER}"` where the variable is unset gives "".
    body = json.dumps({"Labels": {LABEL_OWNER: bad, "a": "b"}}).encode()
    assert labelled(body, route)["Labels"] == {LABEL_OWNER: OWNER, "a": "b"}


def test_a_mounts_volume_with_an_owner_label_that_names_nobody_is_made_labelled() -> None:
    mount = {"Type": "volume", "Source": "v", "VolumeOptions": {"Labels": {LABEL_OWNER: ""}}}
    done = label(CONTAINER, json.dumps({"HostConfig": {"Mounts": [mount]}}).encode(), OWNER)
    assert [v.labels for v in done.volumes] == [{LABEL_OWNER: OWNER}]


@pytest.mark.parametrize(
    "body, why",
    [
        (b"", "the body is empty"),  # 20.10 refuses it, later engines make a volume of it
        (b" \r\n", "the body is empty"),
        (b"null", "not an object"),
        (b"[1, 2]", "not an object"),
        (b'"x"', "not an object"),
        (b"not json", "not JSON"),
        (b'{"Image": "x"} garbage', "goes on after"),
        (b'{"Image": "x"}{"Image": "y"}', "goes on after"),
        (b'{"Labels": {}, "labels": null}', "'Labels', 'labels'"),
        (b'{"LABELS": {"a": "b"}}', "'LABELS'"),
        ('{"Label\u017f": null}'.encode(), "Label\u017f"),  # a long s: Go folds it to an s
        (b'{"Labels": {"a": "b"}, "Labels": null}', "comes twice"),
        (b'{"Env": [{"a": 1, "a": 2}]}', "comes twice"),  # in any object
        (b'{"Env": ["\xff"]}', "not UTF-8"),
        (b'\xef\xbb\xbf{"Image": "x"}', "not JSON"),  # a BOM, which Go refuses too
        (b"\xff\xfe{\x00}\x00", "not UTF-8"),  # UTF-16, which Python's json would read
        (b'{"Memory": NaN}', "NaN is not JSON"),
        (b'{"Memory": -Infinity}', "Infinity is not JSON"),
        (b"[" * 100_000, "nests deeper"),
        (b'{"Env": [%s]}' % b",".join([b'""'] * MAX_VALUES), "more than 131072 JSON values"),
        (b'{"Labels": "a string"}', "Labels is not an object"),
        (b'{"Labels": {"a": 1}}', "not a string"),
        (b'{"HostConfig": {"binds": ["v:/d"]}}', "'binds'"),
        (b'{"hostconfig": {}}', "'hostconfig'"),
        (b'{"HostConfig": {"Binds": "v:/d"}}', "Binds is not a list"),
        (b'{"HostConfig": {"Mounts": [{"type": "volume", "Source": "v"}]}}', "'type'"),
        (b'{"HostConfig": {"Mounts": [{"Type": "volume", "SOURCE": "v"}]}}', "'SOURCE'"),
        (b'{"HostConfig": {"Mounts": ["v"]}}', "Mounts is not a list of dict"),
    ],
)
def test_a_body_the_engine_may_read_otherwise_is_refused(body: bytes, why: str) -> None:
    with pytest.raises(Refused) as err:
        label(CONTAINER, body, OWNER)
    assert why in str(err.value)
    assert "\n" not in str(err.value)


def test_the_named_volumes_of_a_container_create() -> None:
    host = {
        "Binds": ["data:/d", "/host:/h", "ro:/r:ro", "/anonymous", None, "a:b:c:d", "n2:/x"],
        "VolumeDriver": "local",
        "Mounts": [
            {"Type": "volume", "Source": "m1", "Target": "/m1"},
            {
                "Type": "volume",
                "Source": "m2",
                "VolumeOptions": {
                    "Labels": {"mine": "yes"},
                    "DriverConfig": {"Name": "local", "Options": {"type": "tmpfs"}},
                },
            },
            {"Type": "volume", "Target": "/anonymous"},
            {"Type": "bind", "Source": "/host"},
            {"Type": "volume", "Source": "kept", "VolumeOptions": {"Labels": {LABEL_KEEP: "true"}}},
            {
                "Type": "volume",
                "Source": "theirs",
                "VolumeOptions": {"Labels": {LABEL_OWNER: SOMEONE}},
            },
        ],
    }
    body = json.dumps({"Image": "x", "HostConfig": host}).encode()
    mine = {LABEL_OWNER: OWNER}
    assert label(CONTAINER, body, OWNER).volumes == (
        Volume("data", "local", {}, mine),
        Volume("ro", "local", {}, mine),
        Volume("n2", "local", {}, mine),
        Volume("m1", "", {}, mine),
        Volume("m2", "local", {"type": "tmpfs"}, {"mine": "yes", **mine}),
    )
    # Only a container create mounts volumes; a network or volume body's HostConfig is nothing.
    assert label(NETWORK, body, OWNER).volumes == ()
    nothing = json.dumps({"Image": "x", "HostConfig": None}).encode()
    assert label(CONTAINER, nothing, OWNER).volumes == ()


def test_a_create_s_hostconfig_fields_at_the_top_are_read_where_the_engine_reads_them() -> None:
    """dockerd 20.10 reads HostConfig's fields at the top of the body where no HostConfig is
    given (or a null one), and a VolumeDriver at the top for a HostConfig that names none."""
    mine = {LABEL_OWNER: OWNER}
    top = {"Binds": ["b:/b"], "Mounts": [{"Type": "volume", "Source": "m", "Target": "/m"}]}
    for host in ({}, {"HostConfig": None}):
        body = json.dumps({"Image": "x", **top, **host}).encode()
        made = (Volume("b", "", {}, mine), Volume("m", "", {}, mine))
        assert label(CONTAINER, body, OWNER).volumes == made
    body = json.dumps({"Image": "x", "VolumeDriver": "d", "HostConfig": {"Binds": ["h:/h"]}})
    assert label(CONTAINER, body.encode(), OWNER).volumes == (Volume("h", "d", {}, mine),)


def test_a_legacy_start_s_body_goes_as_it_came_with_its_volumes() -> None:
    mine = {LABEL_OWNER: OWNER}
    for body in (b'{"Binds": ["v:/v", "/host:/h"]}', b'{"HostConfig": {"Binds": ["v:/v"]}}'):
        done = label(Route.LEGACY_START, body, OWNER)
        assert done.body == body and done.volumes == (Volume("v", "", {}, mine),)


def test_a_labelled_body_grows_by_the_label_alone() -> None:
    """Characters beyond ASCII go on as UTF-8, not as escapes of up to 12 bytes each."""
    doc = {"Image": "x", "Env": ["W=" + "\U0001f600é" * 1000]}
    body = json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()
    out = label(CONTAINER, body, OWNER).body
    assert len(out) == len(body) + len(f',"Labels":{{"{LABEL_OWNER}":"{OWNER}"}}')
    # A lone surrogate came as an escape, and goes on as one: it has no UTF-8.
    assert b'"C=\\ud800"' in label(CONTAINER, b'{"Env":["C=\\ud800"]}', OWNER).body
