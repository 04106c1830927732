"""The agent's command-line options (cli.py's agent, reap, status): each sets a setting of
the config file by its flat name, and leaves the file's value in force when absent."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from exitwatch.alive import LEASE_DIR, WATCHDOG_DIR
from exitwatch.contract import HOOK_DIR
from exitwatch.service.config import DEFAULT_PATH, Config


def option(*decls: str, **kw: Any) -> Callable:
    """An option whose absence leaves the config file's value (or the default) in force."""
    return click.option(*decls, default=None, **kw)


config_path = click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    help=f"TOML settings file (default: {DEFAULT_PATH} if it exists).",
)
roots = click.option(
    "--workdir-root",
    "workdir_roots",
    multiple=True,
    type=click.Path(file_okay=False),
    help="Look for marked workdirs under DIR (repeatable; replaces /tmp and /var/tmp).",
)
depth = option(
    "--workdir-depth",
    type=click.IntRange(1, 16),
    help="How many levels below a root a workdir may be [default: [workdirs] depth of the config].",
)
docker_host = option(
    "--docker-host", metavar="URL", help="Docker engine URL (default: DOCKER_HOST, or the socket)."
)
engines = click.option(
    "--engine", "engines", multiple=True, metavar="URL", help="Follow this engine (repeatable)."
)
find_engines = option(
    "--find-engines/--no-find-engines", help="Follow the engines found on the host too."
)
dry_run = click.option(
    "--dry-run", is_flag=True, default=None, help="Log what would be removed; remove nothing."
)
status_socket = option(
    "--status-socket",
    metavar="PATH",
    help=f"The agent's status socket [default: {Config.status_socket}].",
)
audit_log = option(
    "--audit-log",
    metavar="PATH",
    help=f'JSON-lines record of removals and refusals ("" for none) [default: {Config.audit_log}].',
)
hook_dir = option(
    "--hook-dir", metavar="DIR", help=f"The spool of on-death hooks [default: {HOOK_DIR}]."
)
lease_dir = option(
    "--lease-dir", metavar="DIR", help=f"The spool of leases [default: {LEASE_DIR}]."
)
watchdog_dir = option(
    "--watchdog-dir", metavar="DIR", help=f"The spool of watchdogs [default: {WATCHDOG_DIR}]."
)


def spools(command: Callable) -> Callable:
    """The spools' options: hooks, leases, watchdogs."""
    return hook_dir(lease_dir(watchdog_dir(command)))


def resources(command: Callable) -> Callable:
    """Where the resources are, for `agent` and `reap` alike: workdir roots and depth, the
    engines, the spools."""
    for decorate in (spools, find_engines, engines, docker_host, depth, roots):
        command = decorate(command)
    return command
