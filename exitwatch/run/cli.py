"""The command line of the runner's side: labels, mark, on-death and run. Each works
without root and without an agent."""

from __future__ import annotations

import errno
import json
import logging
import os
import sys

import click

from exitwatch.contract import (
    ENV_HOOK_DIR,
    ENV_OWNER,
    HOOK_MAX_TIMEOUT,
    cancel_hook,
    hook_dir,
    mark_workdir,
    on_death,
    owner_labels,
)
from exitwatch.owner import OwnerError

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
        try:
            if not cancel_hook(cancel):
                raise click.ClickException(
                    f"no hook {cancel}: it ran, or was cancelled; nothing is left to cancel"
                )
        except (ValueError, OSError) as err:
            raise click.ClickException(_why(err)) from None
        return
    if not command:
        raise click.UsageError("give the command to run after --, or --cancel ID")
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
    pid = _owning_pid(pid)
    try:
        click.echo(on_death(command, pid=pid, timeout=timeout, env=pairs))
    except ProcessLookupError:
        raise click.ClickException(_no_process(pid)) from None
    except (ValueError, OwnerError, OSError) as err:
        raise click.ClickException(_why(err)) from None


def _why(err: Exception) -> str:
    """One line for an error of the hook spool or of a hook, with what to do."""
    if not (isinstance(err, OSError) and err.strerror):
        return str(err)
    spool = err.filename or ""
    if isinstance(err, FileNotFoundError) and spool == hook_dir():
        return (
            f"no exitwatch agent on this host? (its hook spool {spool} is missing): install "
            f"and start exitwatch, or set {ENV_HOOK_DIR} to the agent's [hooks] dir"
        )
    if err.errno == errno.EPERM:  # open_spool's: a spool that others could tamper with
        return (
            f"hook spool {spool}: {err.strerror}: it must be a directory of root's, mode "
            f"1733, as the agent makes it (or set {ENV_HOOK_DIR} to the agent's [hooks] dir)"
        )
    if isinstance(err, PermissionError):
        return (
            f"hook spool {spool}: {err.strerror}: anyone may add a hook only to a spool of "
            "mode 1733, as the agent makes it: ask root to fix its mode"
        )
    return f"hook spool {spool}: {err.strerror}"


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
@click.argument("argv", nargs=-1, required=True, type=click.UNPROCESSED, metavar="-- CMD [ARGS]...")
def run(grace: float, no_tmpdir: bool, argv: tuple[str, ...]) -> None:
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
        code = supervise(argv, Settings(grace=grace, tmpdir=not no_tmpdir))
    except RunError as err:
        click.echo(f"exitwatch run: {err}", err=True)
        code = SETUP_FAILED
    sys.exit(code)


def _owning_pid(pid: int | None) -> int:
    return os.getppid() if pid is None else pid
