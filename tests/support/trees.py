"""Directory trees the tests build and check: a checksum of a tree (the victim's, which no
removal may change), unmounting what a test mounted below one, and nested workdir roots."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
from pathlib import Path

from exitwatch import mark_workdir
from exitwatch.owner import Owner

from support.procs import kill, spawn_owner


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


def nest(top: Path) -> tuple[Path, Path, Owner]:
    """top/inner (a root, marked) and top/other (a plain workdir) of an owner now dead."""
    owner = spawn_owner()
    inner, other = top / "inner", top / "other"
    for path in (inner, other):
        (path / "sub").mkdir(parents=True)
        (path / "sub" / "data").write_bytes(b"x" * 100)
        mark_workdir(path, owner.pid)
    kill(owner)
    return inner, other, owner.owner
