"""`exitwatch adopt` under faults: a container client whose owner cannot be read from /proc
(the reading seam made to fail, as a transient error would) has its creations refused with
a clear answer and everything else served; the service SIGKILLed mid-stream and started
again on the same socket file; the engine restarted under it; 256 clients at once."""

from __future__ import annotations

import errno
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from exitwatch import procfs
from exitwatch.adopt.peers import Adopting
from exitwatch.contract import ADOPT_OWNER, LABEL_ADOPT, LABEL_OWNER, LABEL_OWNER_NAME
from exitwatch.engine.url import Endpoint
from exitwatch.proxy.server import Proxy, listen

from support.adopt import (
    Adopt,
    adopting,
    cli_mounts,
    holding,
    init_owner,
    owned,
    runner_argv,
    short_dir,
)
from support.procs import wait_for

# What a runner in a container asks: two reads, then a container, a network and a volume.
CLIENT = r"""
docker version --format '{{.Server.APIVersion}}' >/dev/null && echo version-ok
docker ps -a -q >/dev/null && echo ps-ok
docker run -d --name $P-c $IMAGE sleep 1000 >/dev/null 2>/tmp/err && echo run-ok || cat /tmp/err
docker network create $P-n >/dev/null 2>/tmp/err && echo net-ok || cat /tmp/err
docker volume create $P-v >/dev/null 2>/tmp/err && echo vol-ok || cat /tmp/err
"""


class _Failing:
    """procfs.cmdline that fails with EIO for processes in a pid namespace other than the
    host's (container clients) while `on`."""

    def __init__(self) -> None:
        self.on = False
        self.real = procfs.cmdline

    def __call__(self, pid: int, limit: int, proc: str = procfs.PROC) -> list[bytes]:
        if self.on and len(procfs.nspid(pid, proc)) > 1:
            raise OSError(errno.EIO, "Input/output error")
        return self.real(pid, limit, proc)


@pytest.fixture
def served(engine, monkeypatch) -> Iterator[tuple[Path, _Failing]]:
    """An adopt socket in this process (its policy exitwatch adopt's own, with no rules)
    in front of the private engine, whose /proc reading can be made to fail."""
    failing = _Failing()
    monkeypatch.setattr(procfs, "cmdline", failing)
    where = tempfile.mkdtemp(prefix="exitwatch-adopt-")
    proxy = Proxy(
        listen(where), Endpoint.parse(engine.host), Adopting((), Endpoint.parse(engine.host))
    )
    proxy.start()
    try:
        yield Path(where, "docker.sock"), failing
    finally:
        proxy.stop()
        shutil.rmtree(where)


def _client(engine, sock: Path, name: str, prefix: str) -> str:
    argv = ["docker", "run", "--rm", "--name", name, "-v", f"{sock}:/var/run/docker.sock"]
    argv += ["--label", f"{LABEL_ADOPT}={ADOPT_OWNER}"]  # a runner container (Recipe 1)
    argv += [*cli_mounts(), "-e", f"P={prefix}", "-e"]
    argv += [f"IMAGE={engine.image}", engine.image, "sh", "-c", CLIENT]
    done = subprocess.run(argv, env=engine.env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_container_client_of_unreadable_owner_has_its_creations_refused(engine, served) -> None:
    sock, failing = served
    failing.on = True
    out = _client(engine, sock, "unread", "never").splitlines()
    assert [line for line in out if line.endswith("-ok")] == ["version-ok", "ps-ok"]
    errors = [line for line in out if "Error response from daemon" in line]
    assert len(errors) == 3, out
    for line in errors:
        assert "exitwatch: creations are refused here: /proc could not be read for pid" in line
        # Debian 13's CLI (26.1) ends the daemon's message with a full stop; 28's does not.
        assert line.removesuffix(".").endswith(": Input/output error"), line
    api = engine.client.api
    assert [c["Names"] for c in api.containers(all=True)] == []
    assert [n["Name"] for n in api.networks() if n["Name"].startswith("never")] == []
    assert not api.volumes()["Volumes"]

    # The error passed: the next connections' creations are labelled with the client's
    # container's init, and named for that container.
    failing.on = False
    assert _client(engine, sock, "healed", "after").splitlines() == [
        "version-ok",
        "ps-ok",
        "run-ok",
        "net-ok",
        "vol-ok",
    ]
    labels = api.inspect_container("after-c")["Config"]["Labels"]
    assert LABEL_OWNER in labels and labels[LABEL_OWNER_NAME] == "container healed"
    assert LABEL_OWNER in api.inspect_network("after-n")["Labels"]
    assert LABEL_OWNER in api.inspect_volume("after-v")["Labels"]


# -- the service and the engine going away ------------------------------------------------------


def test_the_service_sigkilled_mid_stream_serves_again_on_the_same_socket_file(
    engine, tmp_path
) -> None:
    where = short_dir()
    path = where / "docker.sock"
    held = holding(path)  # as exitwatch-adopt.socket holds it across the service's restarts
    inode = os.stat(path).st_ino
    first = Adopt(engine.socket, path, tmp_path / "adopt.log", held=held)
    second = None
    follow = late = None
    try:
        first.wait_ready()
        # A runner container that mounts the socket now, and a client streaming through it.
        engine.docker(*runner_argv(first, "runner", engine.image, "sleep", "1000"))
        engine.docker(
            "run",
            "-d",
            "--name",
            "ticker",
            engine.image,
            "sh",
            "-c",
            "while :; do echo tick; usleep 10000; done",
        )
        follow = subprocess.Popen(
            ["docker", "logs", "-f", "ticker"],
            env=engine.env(DOCKER_HOST=f"unix://{path}"),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert follow.stdout.readline() == "tick\n"
        first.kill()
        # The stream ends with the service (its client is not left hanging), the engine's
        # side is untouched, and the socket file is the same one.
        follow.wait(timeout=30)
        assert engine.client.api.inspect_container("ticker")["State"]["Running"]
        assert os.stat(path).st_ino == inode
        # A client that comes while nothing serves waits in the backlog ...
        late = subprocess.Popen(
            ["docker", "ps", "-a", "--format", "{{.Names}}"],
            env=engine.env(DOCKER_HOST=f"unix://{path}"),
            stdout=subprocess.PIPE,
            text=True,
        )
        second = Adopt(engine.socket, path, tmp_path / "adopt.log", held=held)
        second.wait_ready(count=2)
        # ... and is answered once the service is back.
        out, _ = late.communicate(timeout=60)
        assert late.returncode == 0 and sorted(out.split()) == ["runner", "ticker"]
        # The container that mounted the socket before the kill reaches it still (its
        # mount is the same inode), and what it creates is its own.
        engine.docker("exec", "runner", "docker", "run", "-d", "--name", "after", engine.image)
        assert owned(engine, init_owner(engine, "runner"))["containers"] == ["after"]
        assert os.stat(path).st_ino == inode
    finally:
        for proc in (follow, late):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
        first.stop()
        if second is not None:
            assert second.stop() == 0
        held.close()
        shutil.rmtree(where)


def test_the_engine_restarted_under_the_service(engine, tmp_path) -> None:
    with adopting(engine, logs=tmp_path) as adopt:
        env = engine.env(DOCKER_HOST=f"unix://{adopt.listen}")
        engine.stop()
        try:
            # No engine: the client is told so, as by a dead engine's socket; the service stays.
            gone = subprocess.run(["docker", "ps"], env=env, capture_output=True, timeout=60)
            assert gone.returncode != 0
            assert adopt.proc.poll() is None
        finally:
            engine.start()
        engine.docker(*runner_argv(adopt, "runner", engine.image, "sleep", "1000"))
        engine.docker("exec", "runner", "docker", "run", "-d", "--name", "after", engine.image)
        assert owned(engine, init_owner(engine, "runner"))["containers"] == ["after"]
        assert adopt.stop() == 0


CLIENTS = 256


def test_256_clients_at_once_all_get_their_answers(engine, tmp_path) -> None:
    ping = b"GET /_ping HTTP/1.1\r\nHost: docker\r\n\r\n"
    listing = b"GET /containers/json HTTP/1.1\r\nHost: docker\r\nConnection: close\r\n\r\n"
    engine.docker("run", "-d", "--name", "listed", engine.image, "sleep", "1000")

    with adopting(engine, logs=tmp_path) as adopt:
        answered = []

        def client(n: int) -> bytes:
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(120)
                s.connect(str(adopt.listen))
                s.sendall(ping)
                data = b""
                while not data.endswith(b"\r\n\r\nOK"):
                    chunk = s.recv(65536)
                    assert chunk, f"client {n}: closed after {data!r}"
                    data += chunk
                answered.append(n)
                # Each connection is held until all 256 have been answered: served at once.
                wait_for(lambda: len(answered) == CLIENTS, timeout=60, what="every client")
                s.sendall(listing)
                while chunk := s.recv(65536):
                    data += chunk
                return data

        with ThreadPoolExecutor(CLIENTS) as pool:
            answers = list(pool.map(client, range(CLIENTS)))
        assert adopt.stop() == 0
    for data in answers:
        assert data.startswith(b"HTTP/1.1 200 OK\r\n") and data.count(b"HTTP/1.1 200 OK") == 2
        assert b'"/listed"' in data
