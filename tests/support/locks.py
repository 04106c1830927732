"""Turns that test sessions side by side (the two passes, xdist's workers) take at what
the host has only one of: its users database, its bridges' subnets."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator

# Root's; /run/lock itself is anyone's (1777), so the file is opened without following a
# symlink another user may have planted there.
DIRECTORY = "/run/lock"


@contextlib.contextmanager
def turn(name: str) -> Iterator[None]:
    """This session's turn at `name`, for as long as the block runs."""
    os.makedirs(DIRECTORY, exist_ok=True)
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(os.path.join(DIRECTORY, f"exitwatch-tests-{name}.lock"), flags, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
