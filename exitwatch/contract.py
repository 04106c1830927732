"""The runner contract: the label, the marker, and the two calls runners make."""

from __future__ import annotations

import json
import os

from exitwatch.owner import owner_of

LABEL_OWNER = "exitwatch.owner"
LABEL_KEEP = "exitwatch.keep"
LABEL_COMPOSE_PROJECT = "com.docker.compose.project"
MARKER = ".exitwatch-owner"
MARKER_MAX_BYTES = 4096
ENV_OWNER = "EXITWATCH_OWNER"


def owner_labels(pid: int | None = None) -> dict[str, str]:
    """The labels that tie a container to process `pid` (default: the calling process)."""
    return {LABEL_OWNER: str(owner_of(pid))}


def mark_workdir(path: str | os.PathLike[str], pid: int | None = None) -> None:
    """Mark directory `path` as owned by process `pid` (default: the calling process).

    The marker is written to a temporary name and renamed into place, so the agent never
    reads a half-written one.
    """
    body = json.dumps({"owner": str(owner_of(pid))}).encode()
    dir_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        tmp = f"{MARKER}.{os.getpid()}.tmp"
        fd = os.open(
            tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=dir_fd
        )
        try:
            os.write(fd, body)
        finally:
            os.close(fd)
        os.rename(tmp, MARKER, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    finally:
        os.close(dir_fd)
