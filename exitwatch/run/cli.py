"""The command line of the runner's side: labels, mark, on-death, while-alive, watchdog and
run. Each works without root; on-death, while-alive and watchdog need an agent to act."""

from __future__ import annotations

import errno
import json
import logging
import os
import sys
from collections.abc import Callable

import click

from exitwatch.alive import (
    ENV_LEASE_DIR,
    ENV_WATCHDOG_DIR,
    LEASE_DIR,
    LEASE_MAX_EVERY,
    LEASE_MIN_EVERY,
    WATCHDOG_DIR,
    WATCHDOG_GRACE,
    WATCHDOG_MAX_GRACE,
    WATCHDOG_MAX_TIMEOUT,
    WATCHDOG_MIN_TIMEOUT,
    cancel_lease,
    find_watchdog,
    watchdog,
    while_alive,
)
from exitwatch.contract import (
    ENV_HOOK_DIR,
    ENV_OWNER,
    HOOK_DIR,
    HOOK_MAX_TIMEOUT,
    cancel_hook,
    mark_workdir,
    on_death,
    owner_labels,
)
from exitwatch.owner import OwnerError

_DEFAULTS = {ENV_HOOK_DIR: HOOK_DIR, ENV_LEASE_DIR: LEASE_DIR, ENV_WATCHDOG_DIR: WATCHDOG_DIR}
_pid = click.option(
    "--pid",
    type=click.IntRange(1),
    help="The owning process (default: the parent of this command, i.e. the calling shell).",
)


@click.command()
@_pid
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["json", "env", "docker-args"]),
    default="json",
    show_default=True,
)
def labels(pid: int | None, fmt: str) -> None:
    """Print the owner labels for a process, for `docker run` or a compose file."""
    pid = _owning_pid(pid)
    try:
        labels = owner_labels(pid)
    except ProcessLookupError:
        raise click.ClickException(_no_process(pid)) from None
    except OwnerError as err:
        raise click.ClickException(str(err)) from None
    if fmt == "json":
        click.echo(json.dumps(labels))
    elif fmt == "env":
        click.echo(f"export {ENV_OWNER}={next(iter(labels.values()))}")
    else:
        click.echo(" ".join(f"--label {k}={v}" for k, v in labels.items()))


@click.command()
@click.argument("directory", type=click.Path(file_okay=False))
@_pid
def mark(directory: str, pid: int | None) -> None:
    """Mark DIRECTORY as a workdir of a process, to be removed when it dies."""
    pid = _owning_pid(pid)
    try:
        mark_workdir(directory, pid)
    except ProcessLookupError:
        raise click.ClickException(_no_process(pid)) from None
    except OwnerError as err:
        raise click.ClickException(str(err)) from None
    except OSError as err:
        raise click.ClickException(
            f"cannot mark {directory}: {err.strerror}{_mark_hint(err)}"
        ) from None


@click.command("on-death")
@_pid
@click.option(
    "--timeout",
    type=click.FloatRange(0, HOOK_MAX_TIMEOUT, min_open=True),
    default=60.0,
    show_default=True,
    metavar="S",
    help="Kill the command (and its process group) after S seconds.",
)
@click.option(
    "--env",
    "env",
    multiple=True,
    metavar="NAME[=VALUE]",
    help="Set this for the command; NAME alone takes its value from your environment "
    "(keeps a secret off the command line, where ps shows it).",
)
@click.option("--cancel", metavar="ID", help="Cancel the hook ID instead.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def on_death_cmd(
    pid: int | None, timeout: float, env: tuple[str, ...], cancel: str | None, command: tuple
) -> None:
    """Run COMMAND as you once a process dies, however it dies (SIGKILL included); print
    the hook's id. Spool: $EXITWATCH_HOOK_DIR, or /var/spool/exitwatch/hooks.

    \b
      exitwatch on-death -- curl -fsS -X DELETE https://api.example/sandboxes/42
      exitwatch on-death --cancel ID
    """
    if cancel is not None:
        if command or env or pid is not None:
            raise click.UsageError("--cancel takes no command, --env or --pid")
        _cancel(cancel_hook, cancel, "it ran, or was cancelled; nothing is left to cancel")
        return
    if not command:
        raise click.UsageError("give the command to run after --, or --cancel ID")
    pairs = _env_pairs(env)
    pid = _owning_pid(pid)
    try:
        click.echo(on_death(command, pid=pid, timeout=timeout, env=pairs))
    except ProcessLookupError:
        raise click.ClickException(_no_process(pid)) from None
    except (ValueError, OwnerError, OSError) as err:
        raise click.ClickException(_why(err)) from None


def _cancel(
    cancel: Callable[[str], bool], entry_id: str, gone: str, env: str = ENV_HOOK_DIR
) -> None:
    """Cancel the entry `entry_id` of the spool named by `env` with `cancel`; one line,
    saying `gone`, when it is not there, or why it cannot be cancelled."""
    noun = _SPOOLS[env][0]
    try:
        if not cancel(entry_id):
            raise click.ClickException(f"no {noun} {entry_id}: {gone}")
    except (ValueError, OSError) as err:
        raise click.ClickException(_why(err, env)) from None


def _env_pairs(env: tuple[str, ...]) -> dict[str, str]:
    """--env's NAME=VALUE and NAME (its value from this environment) as a dict."""
    pairs = {}
    for item in env:
        name, sep, value = item.partition("=")
        if not sep:
            if name not in os.environ:
                raise click.BadParameter(
                    f"{name!r} is not set in your environment (give NAME=VALUE, or export NAME)",
                    param_hint="--env",
                )
            value = os.environ[name]
        pairs[name] = value
    return pairs


@click.command("while-alive")
@_pid
@click.option(
    "--every",
    type=click.FloatRange(LEASE_MIN_EVERY, LEASE_MAX_EVERY),
    metavar="S",
    help="Run COMMAND every S seconds (it first runs when the agent sees it).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(0, HOOK_MAX_TIMEOUT, min_open=True),
    metavar="S",
    help="Kill a run (and its process group) after S seconds [default: --every].",
)
@click.option("--env", "env", multiple=True, metavar="NAME[=VALUE]", help="As for on-death.")
@click.option("--cancel", metavar="ID", help="Cancel the lease ID instead.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def while_alive_cmd(
    pid: int | None,
    every: float | None,
    timeout: float | None,
    env: tuple[str, ...],
    cancel: str | None,
    command: tuple,
) -> None:
    """Run COMMAND as you every S seconds for as long as a process lives (a lease: keep a
    remote sandbox alive); print the lease's id. Spool: $EXITWATCH_LEASE_DIR, or
    /var/spool/exitwatch/leases.

    \b
      exitwatch while-alive --every 60 -- curl -fsS -X POST https://api.example/sandboxes/42/keepalive
      exitwatch while-alive --cancel ID
    """
    if cancel is not None:
        if command or env or pid is not None or every is not None:
            raise click.UsageError("--cancel takes no command, --every, --env or --pid")
        _cancel(cancel_lease, cancel, "it was cancelled, or its owner died", ENV_LEASE_DIR)
        return
    if not command or every is None:
        raise click.UsageError("give --every S and the command to run after --, or --cancel ID")
    pairs = _env_pairs(env)
    pid = _owning_pid(pid)
    try:
        click.echo(while_alive(command, every=every, pid=pid, timeout=timeout, env=pairs))
    except ProcessLookupError:
        raise click.ClickException(_no_process(pid)) from None
    except (ValueError, OwnerError, OSError) as err:
        raise click.ClickException(_why(err, ENV_LEASE_DIR)) from None


@click.command("watchdog")
@_pid
@click.option(
    "--timeout",
    type=click.FloatRange(WATCHDOG_MIN_TIMEOUT, WATCHDOG_MAX_TIMEOUT),
    metavar="S",
    help="Arm it: end the process once S seconds pass without a pet.",
)
@click.option(
    "--grace",
    type=click.FloatRange(0, WATCHDOG_MAX_GRACE),
    default=WATCHDOG_GRACE,
    show_default=True,
    metavar="S",
    help="Seconds between SIGTERM and SIGKILL.",
)
@click.option("--pet", is_flag=True, help="Pet the process's watchdog: it makes progress.")
@click.option("--cancel", is_flag=True, help="Disarm the process's watchdog.")
def watchdog_cmd(
    pid: int | None, timeout: float | None, grace: float, pet: bool, cancel: bool
) -> None:
    """Arm, pet or cancel a watchdog on a process (default: the calling shell): once its
    timeout passes without a pet, the agent ends the process (SIGTERM, then SIGKILL after
    the grace), and reaps what it held. Spool: $EXITWATCH_WATCHDOG_DIR, or
    /var/spool/exitwatch/watchdogs.

    \b
      exitwatch watchdog --timeout 600     # arm (again: a new timeout, and a pet)
      exitwatch watchdog --pet             # progress
      exitwatch watchdog --cancel          # done
    """
    if sum((timeout is not None, pet, cancel)) != 1:
        raise click.UsageError("give one of --timeout S (arm), --pet or --cancel")
    pid = _owning_pid(pid)
    try:
        if timeout is not None:
            click.echo(watchdog(timeout, pid=pid, grace=grace).id)
            return
        armed = find_watchdog(pid)
        if not (armed.pet() if pet else armed.cancel()):
            raise click.ClickException(
                f"no watchdog of yours on process {pid}: arm one with --timeout S (it is gone "
                "once cancelled, or once its process died)"
            )
    except ProcessLookupError:
        raise click.ClickException(_no_process(pid)) from None
    except (ValueError, OwnerError, OSError) as err:
        raise click.ClickException(_why(err, ENV_WATCHDOG_DIR)) from None


_SPOOLS = {  # the environment variable naming a spool: its noun, and its table
    ENV_HOOK_DIR: ("hook", "hooks"),
    ENV_LEASE_DIR: ("lease", "leases"),
    ENV_WATCHDOG_DIR: ("watchdog", "watchdogs"),
}


def _why(err: Exception, env: str = ENV_HOOK_DIR) -> str:
    """One line for an error of the spool named by `env` or of one of its entries, with
    what to do."""
    if not (isinstance(err, OSError) and err.strerror):
        return str(err)
    noun, table = _SPOOLS[env]
    spool = err.filename or ""
    if isinstance(err, FileNotFoundError) and spool == (os.environ.get(env) or _DEFAULTS[env]):
        return (
            f"no exitwatch agent on this host? (its {noun} spool {spool} is missing): install "
            f"and start exitwatch, or set {env} to the agent's [{table}] dir"
        )
    if err.errno == errno.EPERM:  # open_spool's: a spool that others could tamper with
        return (
            f"{noun} spool {spool}: {err.strerror}: it must be a directory of root's, mode "
            f"1733, as the agent makes it (or set {env} to the agent's [{table}] dir)"
        )
    if isinstance(err, PermissionError):
        return (
            f"{noun} spool {spool}: {err.strerror}: anyone may add a {noun} only to a spool "
            "of mode 1733, as the agent makes it: ask root to fix its mode"
        )
    return f"{noun} spool {spool}: {err.strerror}"


def _no_process(pid: int) -> str:
    return f"no process with pid {pid}: give --pid a running process (default: this shell)"


def _mark_hint(err: OSError) -> str:
    """What to do when a directory cannot be marked."""
    if err.errno in (errno.ENOTDIR, errno.ELOOP):
        return " (only a directory is marked, never through a symlink: give its own path)"
    if isinstance(err, FileNotFoundError):
        return " (make the directory first)"
    if isinstance(err, PermissionError):
        return " (mark a directory you can write to, as its owner)"
    return ""


class _OneLineUsage(click.Command):
    """Bad use of `run` is one line and exit 2, so that a runner's own output stays readable."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as err:
            click.echo(f"exitwatch run: {err.format_message()} (see --help)", err=True)
            ctx.exit(2)


@click.command(cls=_OneLineUsage, context_settings={"allow_interspersed_args": False})
@click.option(
    "--grace",
    type=click.FloatRange(0, 3600),
    default=5.0,
    show_default=True,
    metavar="S",
    help="Seconds between SIGTERM and SIGKILL for what CMD leaves running.",
)
@click.option("--no-tmpdir", is_flag=True, help="Leave TMPDIR as it is.")
@click.option(
    "--max-time",
    type=click.FloatRange(WATCHDOG_MIN_TIMEOUT, WATCHDOG_MAX_TIMEOUT),
    metavar="S",
    help="Have the agent end the run (SIGTERM, SIGKILL after --grace) after S seconds.",
)
@click.option(
    "--idle-timeout",
    type=click.FloatRange(WATCHDOG_MIN_TIMEOUT, WATCHDOG_MAX_TIMEOUT),
    metavar="S",
    help="... or once CMD wrote nothing to stdout or stderr for S seconds (they become pipes).",
)
@click.argument("argv", nargs=-1, required=True, type=click.UNPROCESSED, metavar="-- CMD [ARGS]...")
def run(
    grace: float,
    no_tmpdir: bool,
    max_time: float | None,
    idle_timeout: float | None,
    argv: tuple[str, ...],
) -> None:
    """Run CMD as one owner, and remove what it leaves when it ends, however it ends.

    CMD's Docker clients (and podman's, when CONTAINER_HOST is set) are pointed at a socket
    of the run's that labels what they create; its TMPDIR is a fresh marked directory.
    Exits with CMD's status (128+N for signal N).
    """
    from exitwatch.run.supervise import SETUP_FAILED, RunError, Settings
    from exitwatch.run.supervise import run as supervise

    # What the removal code warns of, the wrapper says itself: once, as a line of its own.
    logging.getLogger("exitwatch.kinds").setLevel(logging.ERROR)
    try:
        settings = Settings(grace, not no_tmpdir, max_time, idle_timeout)
        code = supervise(argv, settings)
    except RunError as err:
        click.echo(f"exitwatch run: {err}", err=True)
        code = SETUP_FAILED
    sys.exit(code)


def _owning_pid(pid: int | None) -> int:
    return os.getppid() if pid is None else pid
