"""Hooks as the tests make them: planted in a spool as on_death leaves them (a directory of
the user's own, 0700, holding hook.json), or registered for real by a user through
on_death, and the agent that runs them without an engine."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import time
from pathlib import Path

from exitwatch.contract import ENV_HOOK_DIR, HOOK_FILE
from exitwatch.owner import Owner

from support.agentproc import Agent, agent_argv
from support.users import SYSTEM_PYTHON, as_user

REPO = Path(__file__).resolve().parents[2]


def hook_id(n: int) -> str:
    return f"{n:032x}"


def body(owner: Owner, argv: list[str], **over: object) -> dict:
    """A hook file's content, as on_death writes it, with `over` replacing its fields."""
    return {
        "owner": str(owner),
        "argv": argv,
        "cwd": "/",
        "env": {},
        "timeout": 10,
        "created": time.time(),
    } | over


def plant(
    spool: Path,
    name: int | str,
    content: dict | bytes,
    mode: int = 0o600,
    user: pwd.struct_passwd | None = None,
) -> Path:
    """The hook `name` (an int: the id of that number) in `spool`, as on_death leaves one:
    `<spool>/<id>/`, mode 0700, holding hook.json of `mode`; both `user`'s if given. Its
    file's path."""
    d = spool / (hook_id(name) if isinstance(name, int) else name)
    d.mkdir(mode=0o700, exist_ok=True)
    file = d / HOOK_FILE
    file.write_bytes(content if isinstance(content, bytes) else json.dumps(content).encode())
    os.chmod(file, mode)
    if user is not None:
        os.chown(file, user.pw_uid, user.pw_gid)
        os.chown(d, user.pw_uid, user.pw_gid)
    return file


# Registers a hook per argument (a shell script) as the calling user, each owned by a child
# of its own, which it then kills: the hooks' owners are dead once it has printed their ids.
_REGISTER = """
import json, os, subprocess, sys
sys.path.insert(0, sys.argv[1])
from exitwatch import on_death
children = [subprocess.Popen(["sleep", "1000"]) for _ in sys.argv[3:]]
ids = [
    on_death(["sh", "-c", script], pid=child.pid, timeout=float(sys.argv[2]))
    for script, child in zip(sys.argv[3:], children)
]
for child in children:
    child.kill()
    child.wait()
print(json.dumps(ids), flush=True)
"""


def register_as(
    user: pwd.struct_passwd, spool: Path, scripts: list[str], timeout: float = 60.0
) -> list[str]:
    """Register one hook per shell script in `scripts` as `user` (setpriv, no groups) with
    on_death, each owned by a process of the user's that is dead on return; their ids."""
    proc = as_user(
        user,
        f'cd /tmp && exec {SYSTEM_PYTHON} -I -S -c "$@"',
        _REGISTER,
        str(REPO),
        str(timeout),
        *scripts,
        stdout=subprocess.PIPE,
        env={ENV_HOOK_DIR: str(spool), "PATH": "/usr/bin:/bin"},
    )
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, f"registering as {user.pw_name} failed"
    return json.loads(out)


def engineless_agent(
    spool: Path, root: Path, logs: Path, *extra: str, until: str = "following hooks in"
) -> Agent:
    """A real agent (poll source) whose only work is the hooks in `spool`: its engine is
    never there (its container kind keeps trying to reach it, which costs nothing here),
    so it is waited for until it logs `until` (it follows the spool), not until it is
    ready."""
    argv = agent_argv(
        "poll", "unix:///nonexistent/docker.sock", root, extra=("--hook-dir", str(spool), *extra)
    )
    agent = Agent(argv, logs / f"agent-{time.monotonic_ns()}.log")
    agent.wait_log(until)
    return agent
