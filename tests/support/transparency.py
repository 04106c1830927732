"""The transparency comparisons of a labelling socket (`exitwatch run`'s and `exitwatch
adopt`'s): the same client work made through it and directly, whose outputs must be equal.
Imported by a client in a container too (the SDK's), so it needs docker-py alone."""

from __future__ import annotations

import io
import os
import shutil
import socket
import subprocess
import tarfile
from pathlib import Path

import docker


def sh(script: str, env: dict[str, str], cwd: Path | None = None) -> str:
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr.strip()}"
    return done.stdout


def cli_context(image: str, where: Path) -> dict[str, str]:
    """CLI_OPS's environment but DOCKER and SUFFIX: 1 MiB of data and a build context that
    copies it, under `where`."""
    data = where / "data"
    data.write_bytes(os.urandom(1 << 20))
    context = where / "ctx"
    context.mkdir()
    shutil.copy(data, context / "ctx-data")
    (context / "Dockerfile").write_text(f"FROM {image}\nCOPY ctx-data /ctx-data\n")
    return {"IMAGE": image, "DATA": str(data), "CONTEXT": str(context)}


# The docker CLI: run -i, attach, exec -i both ways, logs -f, cp both ways, build, and a
# network and a volume. What it creates is named with $SUFFIX.
CLI_OPS = r"""
D=$DOCKER; I=$IMAGE; N=$SUFFIX
echo hello-stdin | $D run -i --rm $I cat
$D run --rm $I seq 1 20000 | md5sum
$D run -d --name c$N $I sleep 1000 >/dev/null
$D exec -i c$N md5sum < $DATA
$D exec -i c$N cat < $DATA | md5sum
$D run -d --name l$N $I sh -c 'seq 1 3000; sleep 1; echo end' >/dev/null
$D logs -f l$N | md5sum
$D cp $DATA c$N:/tmp/data
$D cp c$N:/tmp/data - | tar -xO | md5sum
DOCKER_BUILDKIT=0 $D build -q -t b$N $CONTEXT >/dev/null 2>&1
$D run --rm b$N md5sum /ctx-data
$D network create n$N >/dev/null
$D volume create v$N >/dev/null
$D run --rm --network n$N -v v$N:/v $I sh -c 'echo in-volume > /v/f; cat /v/f'
"""


def events_ops(since: str, until: str) -> str:
    """The past events between `since` and `until`, streamed by the CLI $D."""
    return f"$D events --since {since} --until {until} --format '{{{{.Type}}}} {{{{.Action}}}}'"


COMPOSE_FILE = """
services:
  main:
    image: {image}
    command: ["sleep", "1000"]
    volumes: ["data:/data"]
    networks: [inner]
networks:
  inner: {{}}
volumes:
  data: {{}}
"""

COMPOSE_OPS = r"""
$COMPOSE -p $PROJECT up -d $WAIT >/dev/null 2>&1
printf 'line one\nline two\n' | $COMPOSE -p $PROJECT exec -T main sh -c 'cat; echo done'
$COMPOSE -p $PROJECT exec -T main sh -c 'echo data > /data/f; cat /data/f'
"""
COMPOSE_OUT = "line one\nline two\ndone\ndata\n"


def sdk_ops(client: docker.DockerClient, image: str, suffix: str) -> list[bytes]:
    """The SDK's run, exec, exec -i by its own hijack, archives both ways, logs followed,
    and a network and a volume; the outputs, the last two the labels' names of those."""
    api = client.api
    # Run, wait, then read the logs whole. Not the SDK's attached run: it follows the logs
    # while the container runs, and dockerd 20.10 ends a follow when the container stops,
    # cutting short under load what the follower had not read yet, on either path (seen in
    # loaded make tests with the container sleeping 1 s and 3 s after its output). A follow
    # is compared below, of a container that keeps running.
    r = client.containers.run(image, ["seq", "1", "5000"], name=f"r{suffix}", detach=True)
    out = [str(r.wait()["StatusCode"]).encode() + b"\n" + r.logs()]
    r.remove()
    c = client.containers.run(
        image, ["sh", "-c", "seq 1 200; sleep 1000"], name=f"s{suffix}", detach=True
    )
    # The exec lingers after its output: dockerd 20.10 may end an attached exec's stream as
    # its process exits before it copied all of it, and under load an exec that exits at once
    # came back empty on the direct path (two loaded make tests, 2026-12-04 and 12-05).
    out.append(c.exec_run(["sh", "-c", "echo exec; seq 1 100; sleep 0.5"]).output)
    # exec -i with the SDK's own hijack: write, half-close, read to the end.
    eid = api.exec_create(c.id, ["sh", "-c", "cat; echo eof"], stdin=True)["Id"]
    sock = api.exec_start(eid, socket=True)
    raw = getattr(sock, "_sock", sock)
    raw.sendall(b"round trip\n" * 1000)
    raw.shutdown(socket.SHUT_WR)
    got = b""
    while chunk := raw.recv(65536):
        got += chunk
    raw.close()
    out.append(demux(got))
    # put and get an archive (of a file of its own: a client in a container has another
    # /etc/hostname on each side)
    payload = b"archived\n" * 1000
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("archived")
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    assert c.put_archive("/tmp", buf.getvalue())
    stream, _ = c.get_archive("/tmp/archived")
    out.append(subprocess.run(["tar", "-xO"], input=b"".join(stream), capture_output=True).stdout)
    lines = b""
    for chunk in c.logs(stream=True, follow=True):
        lines += chunk
        if lines.endswith(b"200\n"):
            break
    out.append(lines)
    net = client.networks.create(f"sn{suffix}")
    vol = client.volumes.create(f"sv{suffix}")
    out.append(str(sorted(net.attrs["Labels"] or {})).encode())
    out.append(str(sorted(vol.attrs["Labels"] or {})).encode())
    return out


def demux(data: bytes) -> bytes:
    """The payload of a multiplexed stream: frame sizes depend on timing, the bytes do not."""
    out = b""
    while data:
        size = int.from_bytes(data[4:8], "big")
        out, data = out + data[8 : 8 + size], data[8 + size :]
    return out
