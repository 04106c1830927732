"""`exitwatch run` as the tests start it: its command line, and the environment of a
caller whose TMPDIR and XDG_RUNTIME_DIR are a directory of the test's own (the `bases`
fixture, tests/conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RUN = [sys.executable, "-m", "exitwatch", "run"]


def env_for(bases: Path, engine=None, **extra: str) -> dict[str, str]:
    """The environment of a caller whose TMPDIR and XDG_RUNTIME_DIR are `bases`, talking to
    `engine` (or to none), with `extra` on top."""
    # Without the engine, one that is not there: cleanup then has nothing to ask.
    env = engine.env() if engine else os.environ | {"DOCKER_HOST": f"unix://{bases}/none.sock"}
    pythonpath = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return (
        env
        | {"TMPDIR": str(bases), "XDG_RUNTIME_DIR": str(bases), "PYTHONPATH": pythonpath}
        | extra
    )


def run(args: list[str], env: dict[str, str], **kw) -> subprocess.CompletedProcess[str]:
    """`exitwatch run ARGS` to its end, its output captured."""
    return subprocess.run(RUN + args, env=env, capture_output=True, text=True, timeout=120, **kw)
