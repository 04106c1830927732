"""The command line: agent, reap, labels, mark."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys

import click

from exitwatch import __version__
from exitwatch.config import SOURCES, Config
from exitwatch.contract import ENV_OWNER, mark_workdir, owner_labels

log = logging.getLogger("exitwatch")

_roots = click.option(
    "--workdir-root",
    "workdir_roots",
    multiple=True,
    type=click.Path(file_okay=False),
    help="Look for marked workdirs under DIR (repeatable; replaces /tmp and /var/tmp).",
)
_depth = click.option(
    "--workdir-depth",
    type=click.IntRange(1, 16),
    default=Config.workdir_depth,
    show_default=True,
    help="How many levels below a root a workdir may be.",
)
_docker_host = click.option(
    "--docker-host", metavar="URL", help="Docker engine URL (default: DOCKER_HOST, or the socket)."
)
_dry_run = click.option(
    "--dry-run", is_flag=True, help="Log what would be removed; remove nothing."
)
_pid = click.option(
    "--pid",
    type=click.IntRange(1),
    help="The owning process (default: the parent of this command, i.e. the calling shell).",
)


def _setup_logging() -> None:
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def _require_root(command: str) -> None:
    if os.geteuid() != 0:
        raise click.ClickException(
            f"{command} must run as root: it removes other users' containers and workdirs"
        )


def _kinds(config: Config) -> list:
    from exitwatch.resources.docker import Containers
    from exitwatch.resources.workdirs import Workdirs

    return [
        Containers(config.docker_host),
        Workdirs(config.workdir_roots, config.workdir_depth),
    ]


def _config(**options: object) -> Config:
    roots = options.pop("workdir_roots", ())
    if roots:
        options["workdir_roots"] = tuple(os.path.abspath(r) for r in roots)
    return Config(**{k: v for k, v in options.items() if v is not None})


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="exitwatch")
def cli() -> None:
    """Remove the Docker containers and workdirs of processes that died without cleaning up."""


@cli.command()
@click.option(
    "--source",
    type=click.Choice(SOURCES),
    default=Config.source,
    show_default=True,
    help="How process exits are followed.",
)
@_dry_run
@click.option(
    "--poll-interval",
    type=click.FloatRange(0.01, 3600),
    default=Config.poll_interval,
    show_default=True,
    metavar="S",
    help="Seconds between checks of the watched owners (poll source).",
)
@_roots
@_depth
@_docker_host
def agent(**options: object) -> None:
    """Watch process exits and reap what dead owners leave behind."""
    _require_root("exitwatch agent")
    _setup_logging()
    config = _config(**options)
    from exitwatch.agent import Agent
    from exitwatch.sources import SourceError, pick

    try:
        source, why = pick(
            config.source,
            poll_interval=config.poll_interval,
            ebpf_max_owners=config.ebpf_max_owners,
        )
    except SourceError as err:
        raise click.ClickException(str(err)) from None
    log.info("exitwatch %s starting: %s", __version__, config.describe())
    log.info("exit source %s", why)
    agent = Agent(config, _kinds(config), source)
    for signo in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signo, lambda *_: agent.stop())
    agent.run()
    log.info("exitwatch stopped")


@cli.command()
@_dry_run
@_roots
@_depth
@_docker_host
def reap(**options: object) -> None:
    """Reap once what dead owners hold now, then exit (no agent needed)."""
    _require_root("exitwatch reap")
    _setup_logging()
    config = _config(**options)
    from exitwatch.agent import Agent

    kinds = _kinds(config)
    problem = kinds[0].ping()
    if problem is not None:
        raise click.ClickException(problem)
    agent = Agent(config, kinds)
    agent.reconcile()
    failed = agent.recorder.counters["removal_errors"]
    if failed:
        raise click.ClickException(f"{failed} removals failed; see the log above")


@cli.command()
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
        raise click.ClickException(f"no process with pid {pid}") from None
    if fmt == "json":
        click.echo(json.dumps(labels))
    elif fmt == "env":
        click.echo(f"export {ENV_OWNER}={next(iter(labels.values()))}")
    else:
        click.echo(" ".join(f"--label {k}={v}" for k, v in labels.items()))


@cli.command()
@click.argument("directory", type=click.Path(file_okay=False))
@_pid
def mark(directory: str, pid: int | None) -> None:
    """Mark DIRECTORY as a workdir of a process, to be removed when it dies."""
    pid = _owning_pid(pid)
    try:
        mark_workdir(directory, pid)
    except ProcessLookupError:
        raise click.ClickException(f"no process with pid {pid}") from None
    except OSError as err:
        raise click.ClickException(f"cannot mark {directory}: {err.strerror}") from None


def _owning_pid(pid: int | None) -> int:
    return os.getppid() if pid is None else pid


def main() -> None:
    cli(prog_name="exitwatch")
