"""The unprivileged user of the tests (the attacker, or the user whose run it is), how to
act as it, and a checksum of the root-owned victim tree it must never change. The
`attacker` and `victim` fixtures (tests/conftest.py) are built on these."""

from __future__ import annotations

import hashlib
import os
import pwd
import stat
import subprocess
from pathlib import Path
from typing import Any

ATTACKER = "exitwatch-test"
# The attacker cannot run pyenv's interpreter under /root; Debian's is world-readable.
SYSTEM_PYTHON = "/usr/bin/python3"


def attacker_user() -> pwd.struct_passwd:
    """The unprivileged user, created (without a home) if it is missing."""
    try:
        return pwd.getpwnam(ATTACKER)
    except KeyError:
        # Another test session may be adding it at the same time: look again, whoever won.
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", ATTACKER],
            check=False,
            capture_output=True,
        )
        return pwd.getpwnam(ATTACKER)


def lazy_umount_below(top: str) -> None:
    """Unmount (lazily) whatever is mounted below `top`, deepest first."""
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4] for line in f]
    for point in sorted((p for p in points if p.startswith(top + "/")), reverse=True):
        subprocess.run(["umount", "-l", point], check=False)


def digest(top: Path) -> str:
    """A checksum of a tree: names, types, modes, owners, contents and link targets."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            h.update(f"{os.path.relpath(p, top)}\0{st.st_mode}\0{st.st_uid}\0".encode())
            if stat.S_ISREG(st.st_mode):
                h.update(Path(p).read_bytes())
            elif stat.S_ISLNK(st.st_mode):
                h.update(os.readlink(p).encode())
    return h.hexdigest()


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
