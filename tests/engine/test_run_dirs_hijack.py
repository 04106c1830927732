"""Root's `exitwatch run` with XDG_RUNTIME_DIR and TMPDIR naming a user's directory (as after
`su` without `-`), attacked by that user, a real process of the unprivileged uid: the run
never makes anything there, its Docker client reaches the real engine through the run's own
socket, and nothing of the run is left. system/test_run_dirs.py has the rule for each layout
without an engine."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from exitwatch.contract import LABEL_OWNER

from support.users import SYSTEM_PYTHON, as_user
from support.wrapper import RUN, env_for

# The user's side: every fresh directory of a run that appears in the user's own directory
# is renamed away at once and replaced by one of the user's with a listening docker.sock,
# which records what root's client sends it and answers with a fake 200.
SWAPPER = r"""
import os, socket, sys, threading
wd = sys.argv[1]
def serve(sock, name):
    while True:
        conn, _ = sock.accept()
        data = conn.recv(1 << 20)
        print("captured", name, len(data), b"API_KEY" in data, flush=True)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
        conn.close()
seen = set()
print("ready", flush=True)
while True:
    for name in os.listdir(wd):
        if not name.startswith("exitwatch-run-") or "." in name or name in seen:
            continue
        seen.add(name)
        try:
            os.rename(os.path.join(wd, name), os.path.join(wd, name + ".taken"))
            os.mkdir(os.path.join(wd, name))
            sock = socket.socket(socket.AF_UNIX)
            sock.bind(os.path.join(wd, name, "docker.sock"))
            sock.listen()
        except OSError as err:
            print("failed", name, err, flush=True)
            continue
        print("swapped", name, flush=True)
        threading.Thread(target=serve, args=(sock, name), daemon=True).start()
"""

# Root's CMD: where it was put, a secret passed to a container it runs, the container's
# owner label as the engine has it, a result file in its TMPDIR.
CMD = r"""
echo "$DOCKER_HOST" "$TMPDIR"
echo done > "$TMPDIR/result.txt"
id=$(docker run -d -e API_KEY=s3cret "$IMAGE" sleep 1000) || exit 3
docker inspect -f '{{index .Config.Labels "exitwatch.owner"}}' "$id"
echo "$EXITWATCH_OWNER"
"""


@pytest.fixture
def users_dir(attacker) -> Iterator[Path]:
    """A directory of the unprivileged user's under /tmp, standing for their TMPDIR and
    XDG_RUNTIME_DIR."""
    top = Path(tempfile.mkdtemp(prefix="exitwatch-user-"))
    os.chmod(top, 0o755)
    os.chown(top, attacker.pw_uid, attacker.pw_gid)
    yield top
    subprocess.run(["rm", "-rf", "--one-file-system", str(top)], check=True)


def _swapper(attacker, where: Path) -> subprocess.Popen:
    proc = as_user(
        attacker,
        f'exec {SYSTEM_PYTHON} -I -S -c "$1" "$2"',
        SWAPPER,
        str(where),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline() == "ready\n"
    return proc


@pytest.mark.parametrize("attack", ["swapping as the run starts", "a hostile parent alone"])
def test_roots_run_in_a_users_directories_falls_back_to_tmp(
    engine, attacker, users_dir, attack
) -> None:
    swapper = _swapper(attacker, users_dir) if attack.startswith("swapping") else None
    env = env_for(users_dir, engine, IMAGE=engine.image)
    outputs = []
    try:
        for _ in range(5 if swapper else 1):
            done = subprocess.run(
                [*RUN, "--", "sh", "-c", CMD], env=env, capture_output=True, text=True, timeout=120
            )
            outputs.append(done)
    finally:
        if swapper is not None:
            swapper.kill()
            said, _ = swapper.communicate()
    for done in outputs:
        assert done.returncode == 0, done.stderr
        host, tmpdir, label, owner = done.stdout.split()
        sock = Path(host.removeprefix("unix://"))
        # The run's socket and TMPDIR went to /tmp, and it said why, one line per directory.
        assert sock.parent.parent == Path(tmpdir).parent == Path("/tmp")
        lines = [ln for ln in done.stderr.splitlines() if ln.startswith("exitwatch run: ")]
        assert len(lines) == 1 and str(users_dir) in lines[0], done.stderr
        assert f"owned by uid {attacker.pw_uid}" in lines[0] and "using /tmp" in lines[0]
        # Its client reached the real engine through the run's socket, which labelled.
        assert label == owner
        assert not sock.parent.exists() and not Path(tmpdir).exists()
    if swapper is not None:
        assert said == "", said  # nothing appeared in the user's directory to swap
    assert list(users_dir.iterdir()) == []
    assert engine.client.api.containers(all=True, filters={"label": LABEL_OWNER}) == []
