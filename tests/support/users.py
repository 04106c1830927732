"""The unprivileged user of the tests (the attacker, or the user whose run it is), and how
to act as it. The `attacker` fixture (tests/conftest.py) is built on these."""

from __future__ import annotations

import contextlib
import os
import pwd
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from support.locks import turn

ATTACKER = "exitwatch-test"
# The attacker cannot run pyenv's interpreter under /root; Debian's is world-readable.
SYSTEM_PYTHON = "/usr/bin/python3"


@contextlib.contextmanager
def users_database() -> Iterator[None]:
    """This session's turn at the host's users database, for as long as it is held: shadow's
    own lock makes a useradd or userdel beside another fail at once ("cannot lock
    /etc/passwd")."""
    with turn("users"):
        yield


def attacker_user() -> pwd.struct_passwd:
    """The unprivileged user, created (without a home) if it is missing."""
    with users_database():
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(ATTACKER)
        argv = ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin"]
        subprocess.run([*argv, ATTACKER], check=True, capture_output=True)
        return pwd.getpwnam(ATTACKER)


def as_user(user: pwd.struct_passwd, script: str, *args: str, **popen: Any) -> subprocess.Popen:
    """Run a shell script with the user's real privileges (no root, no groups)."""
    ids = [f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups"]
    return subprocess.Popen(["setpriv", *ids, "/bin/sh", "-c", script, "sh", *args], **popen)


def swapping_as(user: pwd.struct_passwd, swapper: str, wd: Path, victim: Path) -> subprocess.Popen:
    """The Python script `swapper` (argv: WD VICTIM) run as `user` on Debian's python3,
    swapping things under `wd` for symlinks to `victim`; its stdout is a pipe."""
    script = f'exec {SYSTEM_PYTHON} -I -S -c "$1" "$2" "$3"'
    return as_user(user, script, swapper, str(wd), str(victim), stdout=subprocess.PIPE)


def run_as(user: pwd.struct_passwd, script: str, *args: str) -> None:
    proc = as_user(user, script, *args)
    assert proc.wait(timeout=30) == 0, f"{script!r} failed as {user.pw_name}"


def setpriv_argv(user: pwd.struct_passwd, *argv: str) -> list[str]:
    """`argv` to run with the user's real privileges (no root, no groups), without a shell."""
    ids = [f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups"]
    return ["setpriv", *ids, *argv]


@contextlib.contextmanager
def temporary_user(prefix: str = "exitwatch-t") -> Iterator[pwd.struct_passwd]:
    """A second unprivileged user (no home), named after this session's process so that
    sessions side by side never share one; deleted afterwards."""
    name = f"{prefix}{os.getpid()}"
    argv = ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name]
    with users_database():
        subprocess.run(argv, check=True, capture_output=True)
        made = pwd.getpwnam(name)
    try:
        yield made
    finally:
        with users_database():
            subprocess.run(["userdel", "--force", name], check=False, capture_output=True)
