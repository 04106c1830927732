"""The command line: agent, reap, status, labels, mark, on-death, run."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime

import click

from exitwatch import __version__, logs, procfs
from exitwatch.config import DEFAULT_PATH, SOURCES, Config, ConfigError, load
from exitwatch.contract import (
    ENV_OWNER,
    HOOK_MAX_TIMEOUT,
    cancel_hook,
    mark_workdir,
    on_death,
    owner_labels,
)
from exitwatch.owner import OwnerError

log = logging.getLogger("exitwatch")

STOP_DEADLINE = 1.5  # seconds from SIGTERM to exit, removals under way included
NO_AGENT = 3  # `exitwatch status` with no agent answering, like `systemctl status`


def _option(*decls: str, **kw: object) -> Callable:
    """An option whose absence leaves the config file's value (or the default) in force."""
    return click.option(*decls, default=None, **kw)


_config_path = click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    help=f"TOML settings file (default: {DEFAULT_PATH} if it exists).",
)
_roots = click.option(
    "--workdir-root",
    "workdir_roots",
    multiple=True,
    type=click.Path(file_okay=False),
    help="Look for marked workdirs under DIR (repeatable; replaces /tmp and /var/tmp).",
)
_depth = _option(
    "--workdir-depth",
    type=click.IntRange(1, 16),
    help=f"How many levels below a root a workdir may be [default: {Config.workdir_depth}].",
)
_docker_host = _option(
    "--docker-host", metavar="URL", help="Docker engine URL (default: DOCKER_HOST, or the socket)."
)
_dry_run = click.option(
    "--dry-run", is_flag=True, default=None, help="Log what would be removed; remove nothing."
)
_status_socket = _option(
    "--status-socket",
    metavar="PATH",
    help=f"The agent's status socket [default: {Config.status_socket}].",
)
_hook_dir = _option(
    "--hook-dir",
    metavar="DIR",
    help=f"The spool of on-death hooks [default: {Config.hook_dir}].",
)
_pid = click.option(
    "--pid",
    type=click.IntRange(1),
    help="The owning process (default: the parent of this command, i.e. the calling shell).",
)


def _config(config_path: str | None, **flags: object) -> Config:
    """The config file (if any) under the flags given on the command line."""
    path = config_path or (DEFAULT_PATH if os.path.exists(DEFAULT_PATH) else None)
    try:
        config = load(path) if path else Config()
        given = {k: v for k, v in flags.items() if v not in (None, ())}
        if "workdir_roots" in given:
            given["workdir_roots"] = tuple(os.path.abspath(r) for r in given["workdir_roots"])
        config = replace(config, **given)
        config.validate()
    except ConfigError as err:
        raise click.ClickException(str(err)) from None
    return config


def _kinds(config: Config) -> list:
    """The resource kinds (containers first), or one line saying why the config is bad."""
    from exitwatch.service import make_kinds

    try:
        return make_kinds(config)
    except ConfigError as err:
        raise click.ClickException(str(err)) from None


def _require_root(command: str) -> None:
    if os.geteuid() != 0:
        raise click.ClickException(
            f"{command} must run as root: it removes other users' containers and workdirs"
        )
    foreign = procfs.foreign_namespace("pid", "time")
    if foreign is not None:
        raise click.ClickException(
            f"{command} must run in the host's {foreign} namespace: it judges owners by "
            "their host pids and start times"
        )


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="exitwatch")
def cli() -> None:
    """Remove the Docker containers and workdirs of processes that died without cleaning up."""


@cli.command()
@_config_path
@_option(
    "--source",
    type=click.Choice(SOURCES),
    help="How process exits are followed [default: auto: ebpf, then netlink, then poll].",
)
@_dry_run
@_option(
    "--poll-interval",
    type=click.FloatRange(0.01, 3600),
    metavar="S",
    help=f"Seconds between checks of the watched owners (poll) [default: {Config.poll_interval}].",
)
@_option(
    "--reconcile-interval",
    type=float,
    metavar="S",
    help="Seconds between full listings that retry what was missed, refused or given up; "
    f"0: only at start [default: {Config.reconcile_interval:g}].",
)
@_roots
@_depth
@_docker_host
@_hook_dir
@_status_socket
@_option(
    "--audit-log",
    metavar="PATH",
    help=f'JSON-lines record of removals and refusals ("" for none) [default: {Config.audit_log}].',
)
@_option("--metrics-addr", metavar="HOST:PORT", help="Serve Prometheus metrics here.")
@_option("--log-format", type=click.Choice(["text", "json"]), help="[default: text]")
def agent(config_path: str | None, **flags: object) -> None:
    """Watch process exits and reap what dead owners leave behind.

    SIGTERM or SIGINT stops it within 2 s; SIGHUP re-reads the config file.
    """
    _require_root("exitwatch agent")
    config = _config(config_path, **flags)
    logs.setup(config.log_format)
    from exitwatch.metrics import MetricsError
    from exitwatch.service import Service
    from exitwatch.sources import SourceError
    from exitwatch.status import StatusError

    service = Service(config, started=time.time())
    reload = threading.Event()
    stopping = threading.Event()

    def on_stop(*_: object) -> None:
        stopping.set()
        service.stop()

    def on_reload(*_: object) -> None:
        reload.set()
        service.stop()

    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    signal.signal(signal.SIGHUP, on_reload)
    while True:
        try:
            abandoned = service.run(STOP_DEADLINE)
            # The stop that ended this run is handled; from here on a SIGTERM or SIGHUP
            # sets its flag and stops the next run at once.
            service.rearm()
        except (ConfigError, SourceError, StatusError, MetricsError) as err:
            raise click.ClickException(str(err)) from None
        if stopping.is_set() or not reload.is_set():
            break
        reload.clear()
        try:
            service.config = _config(config_path, **flags)
            log.info("config reloaded: %s", service.config.describe())
        except click.ClickException as err:
            log.error("config not reloaded, the running one stays: %s", err.message)
    log.info("exitwatch stopped")
    if abandoned:
        # Pool threads still removing would hold the interpreter open past the deadline.
        logging.shutdown()
        os._exit(0)


@cli.command()
@_config_path
@_dry_run
@_roots
@_depth
@_docker_host
@_hook_dir
def reap(config_path: str | None, **flags: object) -> None:
    """Reap once what dead owners hold now, then exit (no agent needed)."""
    _require_root("exitwatch reap")
    config = _config(config_path, **flags)
    logs.setup(config.log_format)
    from exitwatch.agent import Agent
    from exitwatch.resources.engine import EngineError

    kinds = _kinds(config)
    problem = kinds[0].ping()
    if problem is not None:
        raise click.ClickException(problem)
    agent = Agent(config, kinds)
    try:
        agent.reconcile()
    except EngineError as err:
        raise click.ClickException(str(err)) from None
    failed = agent.recorder.counters().get("removal_errors", 0)
    if failed:
        raise click.ClickException(f"{failed} removals failed; see the log above")


@cli.command()
@_config_path
@_status_socket
@_hook_dir
@click.option("--json", "as_json", is_flag=True, help="The status as JSON (schema: README).")
@click.option(
    "--since",
    metavar="WHEN",
    help="Show removals from the audit log since WHEN: 90s, 30m, 12h, 7d, or a date.",
)
def status(config_path: str | None, as_json: bool, since: str | None, **flags: object) -> None:
    """Show what the agent watches and what it removed; exit 3 if no agent answers."""
    config = _config(config_path, **flags)
    from exitwatch import audit
    from exitwatch.status import query, render

    doc = query(config.status_socket)
    code = 0
    if doc is None:
        logs.setup("text")
        doc = _scan(config)
        code = NO_AGENT
    if since is not None:
        # The running agent's own audit log, whatever this command's config says.
        path = doc["agent"]["config"]["audit_log"] if doc.get("agent") else config.audit_log
        try:
            doc["reaps"] = list(audit.read(path, _since(since)))
        except OSError as err:
            raise click.ClickException(
                f"cannot read the audit log {path}: {err.strerror}"
            ) from None
    click.echo(json.dumps(doc, indent=2) if as_json else render(doc))
    sys.exit(code)


def _scan(config: Config) -> dict:
    """What a one-shot scan finds, read-only: live owners, and orphans waiting."""
    from exitwatch.index import Index
    from exitwatch.owner import death
    from exitwatch.resources import workdirs
    from exitwatch.resources.engine import EngineError

    index = Index()
    kinds = _kinds(config)
    docker = {"endpoint": kinds[0].host, "connected": True}
    skipped = _SkippedMarkers()
    workdirs.log.addFilter(skipped)
    try:
        for kind in kinds:
            try:
                index.replace_kind(kind.kind, kind.scan().resources)
            except EngineError as err:
                docker = {"endpoint": kinds[0].host, "connected": False, "last_error": str(err)}
    finally:
        workdirs.log.removeFilter(skipped)
    owners, pending = [], []
    for owner in sorted(index.owners()):
        why = death(owner)
        entry = index.describe(owner)
        if why is None:
            owners.append(entry)
        else:
            held = [c["name"] for c in entry.pop("containers")] + entry.pop("workdirs")
            held += [x for k, v in entry.items() if isinstance(v, list) for x in v]
            pending.append({"owner": entry["owner"], "death": why, "what": held})
    return {
        "schema": 1,
        "agent": None,
        "docker": docker,
        "owners": owners,
        "pending": pending,
        "skipped_markers": skipped.count,
    }


class _SkippedMarkers(logging.Filter):
    """Counts the bad-marker warnings of a one-shot scan and keeps them off the terminal,
    where a dozen would bury the status; `exitwatch reap --dry-run` prints them."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if str(record.msg).startswith("marker "):
            self.count += 1
            return False
        return True


def _since(text: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    if text[:-1].isdigit() and text[-1:] in units:
        return time.time() - int(text[:-1]) * units[text[-1]]
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise click.BadParameter(
            f"{text!r} is neither a duration (90s, 30m, 12h, 7d) nor a date (2026-11-30T08:00)",
            param_hint="--since",
        ) from None


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
    except OwnerError as err:
        raise click.ClickException(str(err)) from None
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
    except OwnerError as err:
        raise click.ClickException(str(err)) from None
    except OSError as err:
        raise click.ClickException(f"cannot mark {directory}: {err.strerror}") from None


@cli.command("on-death")
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
                raise click.ClickException(f"no hook {cancel} (it ran, or was cancelled)")
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
        raise click.ClickException(f"no process with pid {pid}") from None
    except (ValueError, OwnerError, OSError) as err:
        raise click.ClickException(_why(err)) from None


def _why(err: Exception) -> str:
    if isinstance(err, OSError) and err.strerror:
        return f"hook spool {err.filename or ''}: {err.strerror}"
    return str(err)


class _OneLineUsage(click.Command):
    """Bad use of `run` is one line and exit 2, so that a runner's own output stays readable."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as err:
            click.echo(f"exitwatch run: {err.format_message()} (see --help)", err=True)
            ctx.exit(2)


@cli.command(cls=_OneLineUsage, context_settings={"allow_interspersed_args": False})
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

    CMD's Docker clients are pointed at a socket of the run's that labels what they create;
    its TMPDIR is a fresh marked directory. Exits with CMD's status (128+N for signal N).
    """
    from exitwatch.supervise import SETUP_FAILED, RunError, Settings
    from exitwatch.supervise import run as supervise

    try:
        code = supervise(argv, Settings(grace=grace, tmpdir=not no_tmpdir))
    except RunError as err:
        click.echo(f"exitwatch run: {err}", err=True)
        code = SETUP_FAILED
    sys.exit(code)


def _owning_pid(pid: int | None) -> int:
    return os.getppid() if pid is None else pid


def main() -> None:
    cli(prog_name="exitwatch")
