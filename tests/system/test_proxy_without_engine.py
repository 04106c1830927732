"""The run's socket with no engine behind it: the docker CLI fails through it as it fails
without it. engine/test_proxy.py has the socket in front of the private engine."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

from exitwatch.owner import owner_of
from exitwatch.proxy.policy import Always
from exitwatch.proxy.server import Proxy, listen

OWNER = str(owner_of())


def test_no_engine_is_an_error_as_without_the_socket(tmp_path) -> None:
    where = tempfile.mkdtemp(prefix="exitwatch-proxy-")
    proxy = Proxy(listen(where), str(tmp_path / "none.sock"), Always(OWNER))
    proxy.start()
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("DOCKER_")}
        direct = subprocess.run(
            ["docker", "version"],
            env=env | {"DOCKER_HOST": f"unix://{tmp_path}/none.sock"},
            capture_output=True,
            text=True,
            timeout=60,
        )
        through = subprocess.run(
            ["docker", "version"],
            env=env | {"DOCKER_HOST": f"unix://{where}/docker.sock"},
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        proxy.stop()
        shutil.rmtree(where)
    assert direct.returncode == through.returncode != 0
    assert "error during connect" in through.stderr or "Cannot connect" in through.stderr
