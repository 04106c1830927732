"""Which engine a Docker URL names: one reading for the agent, `exitwatch run` and adopt,
so that all three speak to the same socket for the same DOCKER_HOST. Light to import:
`exitwatch run` reads it at its start."""

from __future__ import annotations

DEFAULT_HOST = "unix:///var/run/docker.sock"


def socket_path(url: str) -> str | None:
    """The path of a unix:// engine URL; None for any other (tcp://, ssh://, ...). As
    docker-py has it, unix://var/run/docker.sock is /var/run/docker.sock."""
    scheme, _, rest = url.strip().partition("://")
    path = "/" + rest.lstrip("/")
    return path if scheme == "unix" and path != "/" else None
