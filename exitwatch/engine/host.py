"""The engines a host runs where their programs put them, found by looking: root's podman
service, and each user's rootless Docker and rootless podman under the user's runtime
directory (/run/user/UID, made by logind or pam_systemd at login, root's and mode 0755
above it, so a user can make no other). The agent follows them beside the engines its
settings name (kinds/docker/kind.py), unless told not to.

What a user's directory holds is that user's word: only a socket that is the user's own,
reached through no symlink, is taken, and it is reached the same way each time it is
spoken to (url.Endpoint.owned)."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass

from exitwatch.engine.url import RUN_USER, Endpoint

ROOT_PODMAN = "/run/podman/podman.sock"
# Where each rootless engine puts its socket under the user's runtime directory.
USER_ENGINES = (("docker.sock", "rootless Docker"), ("podman/podman.sock", "rootless podman"))


@dataclass(frozen=True)
class Found:
    endpoint: Endpoint
    how: str  # for people: "root's podman", "rootless Docker of uid 1000"


def find(run_user: str = RUN_USER, root_podman: str = ROOT_PODMAN) -> list[Found]:
    """The engines whose sockets are there now, root's podman first, then by uid. A socket
    that is not there is not (a runtime directory going as its user logs out). Raises
    OSError when `run_user` cannot be listed (a full fd table): that proves nothing of
    the engines in it."""
    found = []
    if _socket_of(root_podman, 0):
        found.append(Found(Endpoint.owned(root_podman, 0), "root's podman"))
    try:
        names = os.listdir(run_user)
    except FileNotFoundError:
        names = []
    for uid in sorted(int(n) for n in names if n.isdigit() and len(n) < 11):
        for rel, what in USER_ENGINES:
            path = f"{run_user}/{uid}/{rel}"
            if _socket_of(path, uid):
                found.append(Found(Endpoint.owned(path, uid), f"{what} of uid {uid}"))
    return found


def _socket_of(path: str, uid: int) -> bool:
    """Whether `path` is a socket (not a symlink to one) of `uid` now: a first look; each
    connection checks again (url.Endpoint.owned)."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISSOCK(st.st_mode) and st.st_uid == uid
