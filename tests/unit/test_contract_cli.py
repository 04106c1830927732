"""`exitwatch labels` and `exitwatch mark` as the README shows them used: from a shell, the
default owner being the caller (the shell), with the real engine and real directories."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

from exitwatch.contract import LABEL_OWNER, MARKER
from exitwatch.kinds.workdirs.kind import Workdirs
from exitwatch.owner import current_boot_id, owner_of

from support.agentproc import exists

EXITWATCH = shlex.join([sys.executable, "-m", "exitwatch"])
# The shell's own owner string, printed by the shell itself before it exits.
SELF = 'echo "$$ $(cut -d" " -f22 /proc/$$/stat)"'


def sh(script: str, env: dict[str, str] | None = None) -> tuple[str, list[str]]:
    """Run `script` in sh, which prints its own owner last; (that owner, the other lines)."""
    done = subprocess.run(
        ["sh", "-c", f"{script}\n{SELF}"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    *lines, last = done.stdout.strip().splitlines()
    pid, start = last.split()
    return f"{current_boot_id()}:{pid}:{start}", lines


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
    owner, lines = sh(f'eval "$({EXITWATCH} labels --format env)"\necho "$EXITWATCH_OWNER"')
    assert lines == [owner]


def test_labels_docker_args_label_a_container_with_the_shells_owner(engine):
    script = f"docker run -d $({EXITWATCH} labels --format docker-args) {engine.image} sleep 60"
    owner, lines = sh(script, env=engine.env())
    [cid] = lines
    assert exists(engine, cid)
    labels = engine.client.api.inspect_container(cid)["Config"]["Labels"]
    assert labels[LABEL_OWNER] == owner


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
