"""A real PyPI runner inside a container, on the host's engine through `exitwatch adopt`'s
socket mounted at /var/run/docker.sock: verifiers 0.4.0's Docker runtime, driven as a
library, its code and command line as they are. `docker kill` of its container leaves
nothing of what it made, with the agent running.

The runner's image is python:3.11-slim as support/runners.py makes it offline, with the
verifiers venv (built on the host's Debian python3.11) and that interpreter mounted where
the host has them. It runs on the host's network: verifiers checks its sandbox's port, which
the engine publishes on the host's 127.0.0.1.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
import pytest

from exitwatch.contract import ADOPT_OWNER, LABEL_ADOPT

from support import runners, tools
from support.adopt import Adopt, cli_mounts, init_owner, owned, short_dir
from support.agentproc import GONE_DEADLINE, Agents
from support.procs import wait_for

pytestmark = pytest.mark.runners

# Made by the runner and left for good after a SIGKILL (shared/runners.md): its sandbox.
DRIVER = """
import asyncio, os, sys
from verifiers.v1.runtimes import make_runtime
from verifiers.v1.runtimes.docker import DockerConfig

async def main():
    runtime = make_runtime(DockerConfig(image="python:3.11-slim"))
    await runtime.start()
    with open(sys.argv[1] + ".new", "w") as f:
        f.write(runtime._container)
    os.rename(sys.argv[1] + ".new", sys.argv[1])
    await asyncio.sleep(1000000)

asyncio.run(main())
"""


@dataclass
class _Engine:
    """The bridge engine as support.adopt's helpers ask of one."""

    host: str
    client: docker.DockerClient

    def docker(self, *args: str, both: bool = False) -> str:
        """The CLI's output (with its errors, if `both`)."""
        done = subprocess.run(
            ["docker", *args],
            env={"PATH": "/usr/local/bin:/usr/bin:/bin", "DOCKER_HOST": self.host},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, f"docker {args[0]}: {done.stderr.strip()}"
        return done.stdout + done.stderr if both else done.stdout


@pytest.fixture
def rig(tmp_path) -> Iterator[tuple[_Engine, Adopt, Path]]:
    try:
        venv = tools.verifiers()
    except tools.Unavailable as err:
        pytest.skip(f"NOT PROVEN: verifiers: {err}")
    with runners.bridge_engine() as engine:
        where = short_dir()
        adopt = Adopt(engine.dir / "docker.sock", where / "docker.sock", tmp_path / "adopt.log")
        root = tmp_path / "root"
        root.mkdir()
        agents = Agents(engine.host, root, tmp_path)
        client = docker.DockerClient(base_url=engine.host)
        try:
            adopt.wait_ready()
            agents.start()
            yield _Engine(engine.host, client), adopt, venv
        finally:
            client.close()
            agents.stop()
            adopt.stop()
            shutil.rmtree(where, ignore_errors=True)


@pytest.fixture
def scratch() -> Iterator[Path]:
    """Short: verifiers binds a socket below its TMPDIR (and tmp_path is long under xdist)."""
    where = short_dir("exitwatch-vf-")
    yield where
    shutil.rmtree(where, ignore_errors=True)


def test_verifiers_in_a_killed_container_leaves_nothing(rig, scratch) -> None:
    engine, adopt, venv = rig
    # Its scratch (TMPDIR, HOME) is where the host has it too: verifiers bind-mounts a
    # directory of its TMPDIR into a helper container, which the engine finds on the host.
    made = scratch / "sandbox"
    python = runners.PYTHON
    argv = ["run", "-d", "--name", "vf-runner", "--network", "host"]
    argv += ["-v", f"{adopt.listen}:/var/run/docker.sock", *cli_mounts()]
    argv += ["--label", f"{LABEL_ADOPT}={ADOPT_OWNER}"]  # Recipe 1's opt-in
    argv += ["-v", f"{python}:{python}:ro", "-v", f"{venv}:{venv}:ro"]
    # The host's libraries that the venv's extension modules need (the image has python's).
    for lib in sorted(runners.libraries([str(p) for p in venv.rglob("*.so*")])):
        if not lib.startswith(f"{venv}/"):
            argv += ["-v", f"{lib}:{lib}:ro"]
    argv += ["-v", f"{scratch}:{scratch}", "-e", f"TMPDIR={scratch}", "-e", f"HOME={scratch}"]
    argv += [runners.PYTHON_IMAGE, f"{venv}/bin/python", "-c", DRIVER, str(made)]
    engine.docker(*argv)

    def started() -> str:
        state = engine.docker("inspect", "-f", "{{.State.Status}}", "vf-runner").strip()
        assert state == "running", engine.docker("logs", "vf-runner", both=True)
        return made.exists() and made.read_text()

    sandbox = wait_for(started, timeout=180, what="verifiers to start its sandbox")
    owner = init_owner(engine, "vf-runner")
    assert owned(engine, owner)["containers"] == [sandbox]

    at = time.monotonic()
    engine.docker("kill", "vf-runner")
    nothing = {"containers": [], "networks": [], "volumes": []}
    wait_for(lambda: owned(engine, owner) == nothing, timeout=GONE_DEADLINE, what="reap")
    print(f"\ndocker kill of verifiers' container: nothing left in {time.monotonic() - at:.2f} s")
    # The runner's own container alone is left, stopped, as `docker run -d` leaves one.
    assert engine.docker("ps", "-a", "--format", "{{.Names}}").split() == ["vf-runner"]
