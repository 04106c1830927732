"""The run's socket (exitwatch.proxy.server) against the private engine: each client's output
through it equals the same command's run directly, and whatever it creates carries the run's
owner."""

from __future__ import annotations

import json
import os
import select
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import docker
import h11
import pytest

from exitwatch.contract import LABEL_OWNER
from exitwatch.owner import owner_of
from exitwatch.proxy.policy import Always
from exitwatch.proxy.server import Proxy, listen

from support import tools
from support.transparency import (
    CLI_OPS,
    COMPOSE_FILE,
    COMPOSE_OPS,
    COMPOSE_OUT,
    cli_context,
    events_ops,
    sdk_ops,
    sh,
)

OWNER = str(owner_of())
# Files only: a `-v` of a CLI that is not there leaves a directory in its place.
CLIS = [
    p
    for p in ("/usr/local/bin/docker", "/usr/bin/docker")
    if os.path.isfile(p) and os.access(p, os.X_OK)
]


@pytest.fixture
def proxied(engine) -> Iterator[str]:
    """The DOCKER_HOST of a run's socket in front of the private engine, labelling with OWNER."""
    where = tempfile.mkdtemp(prefix="exitwatch-proxy-")
    proxy = Proxy(listen(where), str(engine.socket), Always(OWNER))
    proxy.start()
    try:
        yield f"unix://{where}/docker.sock"
    finally:
        proxy.stop()
        shutil.rmtree(where)


def labels_of(engine, kind: str, name: str) -> dict[str, str]:
    api = engine.client.api
    info = {
        "container": lambda: api.inspect_container(name)["Config"],
        "network": lambda: api.inspect_network(name),
        "volume": lambda: api.inspect_volume(name),
    }[kind]()
    return info.get("Labels") or {}


# -- the docker CLI ----------------------------------------------------------------------------


@pytest.mark.parametrize("cli", CLIS)
def test_docker_cli_through_the_socket_is_transparent(engine, proxied, tmp_path, cli) -> None:
    common = cli_context(engine.image, tmp_path) | {"DOCKER": cli}
    since = f"{time.time() - 1:.3f}"
    direct = sh(CLI_OPS, engine.env(SUFFIX="d", **common))
    through = sh(CLI_OPS, engine.env(SUFFIX="p", DOCKER_HOST=proxied, **common))
    assert through == direct
    assert direct.startswith("hello-stdin\n") and direct.endswith("in-volume\n")

    for kind, name in [("container", "cp"), ("container", "lp"), ("network", "np")]:
        assert labels_of(engine, kind, name).get(LABEL_OWNER) == OWNER, (kind, name)
    assert labels_of(engine, "volume", "vp").get(LABEL_OWNER) == OWNER
    assert LABEL_OWNER not in labels_of(engine, "container", "cd")
    assert LABEL_OWNER not in labels_of(engine, "network", "nd")

    # The same past events, streamed through either socket.
    events = events_ops(since, f"{time.time():.3f}")
    env = engine.env(D=cli)
    assert sh(events, env | {"DOCKER_HOST": proxied}) == sh(events, env)


def test_events_stream_live_through_the_socket(engine, proxied) -> None:
    follow = subprocess.Popen(
        [
            "docker",
            "events",
            "--filter",
            "type=container",
            "--format",
            "{{.Action}} {{.Actor.Attributes.name}}",
        ],
        env=engine.env(DOCKER_HOST=proxied),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        # The subscription may not be in place yet: create until its event shows. A read
        # waits a second at most, so a create made before the subscription (whose event
        # never comes) cannot hold the test.
        seen, n = "", 0
        deadline = time.monotonic() + 60
        while not seen and time.monotonic() < deadline:
            engine.docker("create", "--name", f"live{n}", engine.image)
            n += 1
            if select.select([follow.stdout], [], [], 1.0)[0]:
                line = follow.stdout.readline()
                seen = line if line.startswith("create") else ""
        assert seen.startswith("create live"), f"no create event in {n} creates"
    finally:
        follow.kill()
        follow.wait()


# -- compose v1 and v2 -------------------------------------------------------------------------


def _compose(engine, proxied, tmp_path, compose: str, wait: str, env: dict[str, str]) -> None:
    (tmp_path / "docker-compose.yml").write_text(COMPOSE_FILE.format(image=engine.image))
    base = engine.env(COMPOSE=compose, WAIT=wait, **env)
    direct = sh(COMPOSE_OPS, base | {"PROJECT": "pd"}, cwd=tmp_path)
    through = sh(COMPOSE_OPS, base | {"PROJECT": "pp", "DOCKER_HOST": proxied}, cwd=tmp_path)
    assert through == direct == COMPOSE_OUT
    api = engine.client.api
    project = {"label": "com.docker.compose.project=pp"}
    containers = api.containers(all=True, filters=project)
    networks = api.networks(filters=project)
    volumes = api.volumes(filters=project)["Volumes"]
    assert containers and networks and volumes
    for item in [*containers, *networks, *volumes]:
        assert (item.get("Labels") or {}).get(LABEL_OWNER) == OWNER, (
            item.get("Name") or item["Names"]
        )
    sh("$COMPOSE -p pp down -v >/dev/null 2>&1", base | {"DOCKER_HOST": proxied}, cwd=tmp_path)
    assert not api.containers(all=True, filters=project)
    assert not api.networks(filters=project)


def test_compose_v1_through_the_socket(engine, proxied, tmp_path) -> None:
    try:
        binary = tools.compose_v1()
    except tools.Unavailable as err:
        pytest.skip(str(err))
    _compose(engine, proxied, tmp_path, binary, "", {})


def test_compose_v2_through_the_socket(engine, proxied, tmp_path) -> None:
    try:
        config = tools.docker_config()
    except tools.Unavailable as err:
        pytest.skip(str(err))
    _compose(engine, proxied, tmp_path, "docker compose", "--wait", {"DOCKER_CONFIG": str(config)})


# -- the Python SDK ----------------------------------------------------------------------------


def test_python_sdk_through_the_socket(engine, proxied) -> None:
    via = docker.DockerClient(base_url=proxied)
    try:
        through = sdk_ops(via, engine.image, "p")
    finally:
        via.close()
    direct = sdk_ops(engine.client, engine.image, "d")
    # The label lists differ by the owner alone.
    assert through[:-2] == direct[:-2]
    assert through[-2:] == [str([LABEL_OWNER]).encode()] * 2 and direct[-2:] == [b"[]"] * 2
    assert labels_of(engine, "container", "sp").get(LABEL_OWNER) == OWNER
    assert labels_of(engine, "volume", "svp").get(LABEL_OWNER) == OWNER


# -- HTTP framing ------------------------------------------------------------------------------


def test_chunked_creation_is_labelled_and_pipelined_requests_answered(engine, proxied) -> None:
    body = json.dumps({"Image": engine.image, "Cmd": ["true"]}).encode()
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in (body[:7], body[7:])) + b"0\r\n\r\n"
    request = (
        b"POST /containers/create?name=chunked HTTP/1.1\r\nHost: x\r\n"
        b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks
    )
    ping = b"GET /_ping HTTP/1.1\r\nHost: x\r\n\r\n"
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(proxied.removeprefix("unix://"))
        # Three requests in one write: the engine answers each, in order, on one connection.
        s.sendall(ping + request + ping)
        conn = h11.Connection(h11.CLIENT)
        conn.send(h11.Request(method="GET", target="/", headers=[("Host", "x")]))
        conn.send(h11.EndOfMessage())
        statuses = []
        while len(statuses) < 3:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(s.recv(65536))
            elif isinstance(event, h11.Response):
                statuses.append(event.status_code)
            elif isinstance(event, h11.EndOfMessage) and len(statuses) < 3:
                conn.start_next_cycle()
                conn.send(h11.Request(method="GET", target="/", headers=[("Host", "x")]))
                conn.send(h11.EndOfMessage())
    assert statuses == [200, 201, 200]
    assert labels_of(engine, "container", "chunked").get(LABEL_OWNER) == OWNER


def test_64_clients_at_once_all_get_their_answers(engine, proxied) -> None:
    def client(n: int) -> str:
        api = docker.APIClient(base_url=proxied, timeout=120)
        try:
            api.ping()
            return api.inspect_image(engine.image)["Id"] + f" {n}"
        finally:
            api.close()

    with ThreadPoolExecutor(64) as pool:
        answers = list(pool.map(client, range(64)))
    image = engine.client.api.inspect_image(engine.image)["Id"]
    assert answers == [f"{image} {n}" for n in range(64)]
