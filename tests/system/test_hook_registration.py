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
from exitwatch.contract import ENV_HOOK_DIR, HOOK_FILE

from support.hooks import REPO
from support.procs import kill, spawn_owner
from support.users import SYSTEM_PYTHON, as_user


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
        # A directory of the caller's own, that only they (and root) may write to, holding
        # a file of theirs; nothing else is left in the spool.
        hook_dir = spool / hook_id
        assert (hook_dir.stat().st_mode & 0o7777, hook_dir.stat().st_uid) == (0o700, os.getuid())
        file = hook_dir / HOOK_FILE
        assert (file.stat().st_mode & 0o7777, file.stat().st_uid) == (0o600, os.getuid())
        assert os.listdir(spool) == [hook_id] and os.listdir(hook_dir) == [HOOK_FILE]
        body = json.loads(file.read_text())
        env = {"A": "b", "TOKEN": "s3cret"}
        assert (body["argv"], body["env"], body["timeout"]) == (["true"], env, 60.0)
        unset = subprocess.run(
            [*exitwatch, "on-death", "--env", "EXITWATCH_UNSET_X", "--", "true"],
            capture_output=True,
            text=True,
        )
        assert unset.returncode == 2 and "'EXITWATCH_UNSET_X' is not set" in unset.stderr
        assert body["owner"].split(":")[-2] == str(owner.pid)
        # Without --pid the owner is the caller of the command, as for `exitwatch labels`.
        mine = subprocess.run(
            [*exitwatch, "on-death", "--", "true"], capture_output=True, text=True, check=True
        ).stdout.strip()
        body = json.loads((spool / mine / HOOK_FILE).read_text())
        assert body["owner"].split(":")[-2] == str(os.getpid())
        assert body["cwd"] == os.getcwd()
        assert cancel_hook(mine)
        subprocess.run([*exitwatch, "on-death", "--cancel", hook_id], check=True)
        assert os.listdir(spool) == []  # cancelled, directory and all
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


# As the user: on_death under the umask argv[2], printing the hook's id.
_UNDER_UMASK = """
import os, sys
sys.path.insert(0, sys.argv[1])
os.umask(int(sys.argv[2], 8))
from exitwatch import on_death
print(on_death(["true"]))
"""


def test_a_hook_is_the_callers_alone_whatever_the_umask(spool, attacker):
    """The agent refuses a hook whose directory or file others could write to, and the
    caller must open the directory it made: the modes are set past the umask, 0777
    (nothing: a directory of mode 0000 its maker cannot open) and 0 (everything)."""
    for mask in ("777", "0"):
        proc = as_user(
            attacker,
            f'exec {SYSTEM_PYTHON} -I -S -c "$@"',
            _UNDER_UMASK,
            str(REPO),
            mask,
            stdout=subprocess.PIPE,
            env={ENV_HOOK_DIR: str(spool)},
        )
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, mask
        hook_dir = spool / out.decode().strip()
        modes = (hook_dir.stat().st_mode & 0o7777, (hook_dir / HOOK_FILE).stat().st_mode & 0o7777)
        assert modes == (0o700, 0o600), mask
        assert (hook_dir.stat().st_uid, (hook_dir / HOOK_FILE).stat().st_uid) == (
            attacker.pw_uid,
        ) * 2
