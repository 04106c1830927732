"""`exitwatch labels` and `exitwatch mark` as the README shows them used: from a shell, the
default owner being the caller (the shell), with real directories. The docker-args format
on a real engine is engine/test_labels_docker_args.py's."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

from exitwatch.contract import ENV_OWNER, ENV_RUN, LABEL_OWNER, MARKER
from exitwatch.kinds.workdirs.kind import Workdirs
from exitwatch.owner import owner_of

from support.cli import sh

EXITWATCH = shlex.join([sys.executable, "-m", "exitwatch"])


def test_labels_json_names_the_caller():
    me = str(owner_of(os.getpid()))
    for args in ([], ["--format", "json"]):
        done = subprocess.run(
            [sys.executable, "-m", "exitwatch", "labels", *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert json.loads(done.stdout) == {LABEL_OWNER: me}


def test_labels_env_exports_the_shells_owner():
    # Read by a child of the shell (docker compose is one): a variable set but not exported
    # would read empty there.
    script = f'eval "$({EXITWATCH} labels --format env)"\nprintenv EXITWATCH_OWNER'
    env = {k: v for k, v in os.environ.items() if k not in (ENV_OWNER, ENV_RUN)}
    owner, lines = sh(script, env=env)
    assert lines == [owner]


def test_mark_marks_a_workdir_of_the_caller(workroot):
    mine = workroot / "mine"
    mine.mkdir()
    subprocess.run([sys.executable, "-m", "exitwatch", "mark", str(mine)], check=True, timeout=60)
    assert json.loads((mine / MARKER).read_text()) == {"owner": str(owner_of(os.getpid()))}

    shells = workroot / "shells"
    shells.mkdir()
    owner, _ = sh(f"{EXITWATCH} mark {shlex.quote(str(shells))}")
    found = {r.key: str(r.owner) for r in Workdirs([str(workroot)]).scan().resources}
    assert found == {str(mine): str(owner_of(os.getpid())), str(shells): owner}
