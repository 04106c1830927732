"""`exitwatch labels --format docker-args` as the README shows it used: from a shell, on a
`docker run` of the private engine, labelling the container with the shell's owner.
unit/test_contract_cli.py has the other formats and `exitwatch mark`."""

from __future__ import annotations

import shlex
import sys

from exitwatch.contract import LABEL_OWNER

from support.agentproc import exists
from support.cli import sh

EXITWATCH = shlex.join([sys.executable, "-m", "exitwatch"])


def test_labels_docker_args_label_a_container_with_the_shells_owner(engine):
    script = f"docker run -d $({EXITWATCH} labels --format docker-args) {engine.image} sleep 60"
    owner, lines = sh(script, env=engine.env())
    [cid] = lines
    assert exists(engine, cid)
    labels = engine.client.api.inspect_container(cid)["Config"]["Labels"]
    assert labels[LABEL_OWNER] == owner
