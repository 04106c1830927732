"""Registering and cancelling on-death hooks, through the CLI and the library, on a real
spool (root's, 1733): what is written, --env from the environment, who may cancel, and
the refusals of what the agent would refuse. engine/test_hooks.py runs them end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from exitwatch import cancel_hook, on_death
from exitwatch.contract import HOOK_SUFFIX

from support.procs import kill, spawn_owner


def test_the_cli_registers_and_cancels(spool):
    owner = spawn_owner()
    try:
        exitwatch = [sys.executable, "-m", "exitwatch"]
        # --env NAME takes the value from the environment: a secret stays out of argv.
        envs = ("--env", "A=b", "--env", "TOKEN")
        done = subprocess.run(
            [*exitwatch, "on-death", "--pid", str(owner.pid), *envs, "--", "true"],
            capture_output=True,
            text=True,
            check=True,
            env=os.environ | {"TOKEN": "s3cret"},
        )
        hook_id = done.stdout.strip()
        body = json.loads((spool / f"{hook_id}{HOOK_SUFFIX}").read_text())
        env = {"A": "b", "TOKEN": "s3cret"}
        assert (body["argv"], body["env"], body["timeout"]) == (["true"], env, 60.0)
        unset = subprocess.run(
            [*exitwatch, "on-death", "--env", "EXITWATCH_UNSET_X", "--", "true"],
            capture_output=True,
            text=True,
        )
        assert unset.returncode == 2 and "'EXITWATCH_UNSET_X' is not set" in unset.stderr
        assert body["owner"].split(":")[1] == str(owner.pid)
        # Without --pid the owner is the caller of the command, as for `exitwatch labels`.
        mine = subprocess.run(
            [*exitwatch, "on-death", "--", "true"], capture_output=True, text=True, check=True
        ).stdout.strip()
        body = json.loads((spool / f"{mine}{HOOK_SUFFIX}").read_text())
        assert body["owner"].split(":")[1] == str(os.getpid())
        assert body["cwd"] == os.getcwd()
        assert cancel_hook(mine)
        subprocess.run([*exitwatch, "on-death", "--cancel", hook_id], check=True)
        assert not (spool / f"{hook_id}{HOOK_SUFFIX}").exists()
        again = subprocess.run(
            [*exitwatch, "on-death", "--cancel", hook_id], capture_output=True, text=True
        )
        assert again.returncode == 1
        assert f"no hook {hook_id}" in again.stderr
        bad = subprocess.run(
            [*exitwatch, "on-death", "--env", "no-equals", "--", "true"],
            capture_output=True,
            text=True,
        )
        assert bad.returncode == 2 and "NAME=VALUE" in bad.stderr
    finally:
        kill(owner)


def test_registering_refuses_what_the_agent_would_refuse(spool):
    for argv, kw in [
        ([], {}),
        (["x"], {"timeout": 0}),
        (["x"], {"env": {"1BAD": "x"}}),
        (["x\0y"], {}),
        (["x" * 70_000], {}),
    ]:
        with pytest.raises(ValueError):
            on_death(argv, **kw)
    with pytest.raises(ValueError):
        cancel_hook("../../etc/passwd")
    assert [p for p in spool.iterdir()] == []
