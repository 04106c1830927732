"""The command line: the agent's side (agent, reap, status); run/cli.py has the runner's."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import replace
from datetime import datetime

import click

from exitwatch import __version__, procfs, shutdown
from exitwatch.run.cli import labels, mark, on_death_cmd, run, watchdog_cmd, while_alive_cmd
from exitwatch.service import flags as opts
from exitwatch.service import logs
from exitwatch.service.config import DEFAULT_PATH, Adopt, Config, ConfigError, load
from exitwatch.sources import MODES

log = logging.getLogger("exitwatch")

NO_AGENT = 3  # `exitwatch status` with no agent answering, like `systemctl status`


def _config(config_path: str | None, notes: list[str] | None = None, **flags: object) -> Config:
    """The config file (if any) under the flags given on the command line; the file's old
    spellings of settings are told in `notes`, for the log."""
    path = config_path or (DEFAULT_PATH if os.path.exists(DEFAULT_PATH) else None)
    try:
        config = load(path, notes=notes) if path else Config()
        given = {k: v for k, v in flags.items() if v not in (None, ())}
        if "workdir_roots" in given:
            given["workdir_roots"] = tuple(os.path.abspath(r) for r in given["workdir_roots"])
        config = config.updated(given)  # the flags' names are the flat ones: no note
        config.validate()
    except ConfigError as err:
        raise click.ClickException(str(err)) from None
    return config


def _kinds(config: Config) -> dict:
    """The resource kinds by name, or one line saying why the config is bad."""
    from exitwatch.service.daemon import make_kinds

    try:
        return make_kinds(config)
    except ConfigError as err:
        raise click.ClickException(str(err)) from None


def _require_root(
    command: str, why: str = "it removes other users' containers and workdirs"
) -> None:
    if os.geteuid() != 0:
        raise click.ClickException(f"{command} must run as root: {why}")
    foreign = procfs.foreign_namespace("pid", "time")
    if foreign is not None:
        raise click.ClickException(
            f"{command} must run in the host's {foreign} namespace (inside a container? run "
            "it on the host): it judges owners by their host pids and start times"
        )


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="exitwatch")
def cli() -> None:
    """Remove the Docker containers and workdirs of processes that died without cleaning up."""


@cli.command()
@opts.config_path
@opts.option(
    "--source",
    type=click.Choice(MODES),
    help="How process exits are followed [default: auto: ebpf, then netlink, then poll].",
)
@opts.dry_run
@opts.option(
    "--poll-interval",
    type=click.FloatRange(0.01, 3600),
    metavar="S",
    help=f"Seconds between checks of the watched owners (poll) [default: {Config.poll_interval}].",
)
@opts.option(
    "--reconcile-interval",
    type=float,
    metavar="S",
    help="Seconds between full listings that retry what was missed, refused or given up; "
    f"0: only at start [default: {Config.reconcile_interval:g}].",
)
@opts.resources
@opts.status_socket
@opts.audit_log
@opts.option("--metrics-addr", metavar="HOST:PORT", help="Serve Prometheus metrics here.")
@opts.option("--log-format", type=click.Choice(["text", "json"]), help="[default: text]")
def agent(config_path: str | None, **flags: object) -> None:
    """Watch process exits and reap what dead owners leave behind.

    SIGTERM or SIGINT stops it within 2 s; SIGHUP re-reads the config file.
    """
    _require_root("exitwatch agent")
    notes: list[str] = []
    config = _config(config_path, notes, **flags)
    logs.setup(config.log_format)
    for note in notes:
        log.warning("%s", note)
    from exitwatch.service.daemon import Service
    from exitwatch.service.metrics import MetricsError
    from exitwatch.service.status.server import StatusError
    from exitwatch.sources import SourceError

    service = Service(config, started=time.time())
    # A run that ends with no stop asked was ended by SIGHUP: the config is read again.
    shutdown.on_signals(
        {signal.SIGTERM: service.stop, signal.SIGINT: service.stop, signal.SIGHUP: service.reload}
    )
    while True:
        try:
            abandoned = service.run(shutdown.DEADLINE)
            # The stop that ended this run is handled; from here on a SIGTERM or SIGHUP
            # sets its flag and stops the next run at once.
            service.rearm()
        except (ConfigError, SourceError, StatusError, MetricsError) as err:
            raise click.ClickException(str(err)) from None
        # Two SIGHUPs close together end two runs, the second at once: a reload each.
        if service.stopping.is_set():
            break
        try:
            notes = []
            service.config = _config(config_path, notes, **flags)
            logs.setup(service.config.log_format)
            for note in notes:
                log.warning("%s", note)
            log.info("config reloaded: %s", service.config.describe())
        except click.ClickException as err:
            log.error("config not reloaded, the running one stays: %s", err.message)
    log.info("exitwatch stopped")
    if abandoned:
        # Pool threads still removing would hold the interpreter open past the deadline.
        logging.shutdown()
        os._exit(0)


@cli.command()
@opts.config_path
@opts.dry_run
@opts.resources
@opts.audit_log
def reap(config_path: str | None, **flags: object) -> None:
    """Reap once what dead owners hold now, then exit (no agent needed)."""
    _require_root("exitwatch reap")
    notes: list[str] = []
    config = _config(config_path, notes, **flags)
    logs.setup(config.log_format)
    for note in notes:
        log.warning("%s", note)
    from exitwatch.agent.audit import AuditLog
    from exitwatch.agent.loop import Agent
    from exitwatch.agent.record import Recorder
    from exitwatch.kinds.registry import by_kind

    kinds = _kinds(config)
    for name, kind in kinds.items():  # what one cannot list, it would find nothing of
        problem = kind.ping()
        if problem is not None:
            table = by_kind(name).table
            raise click.ClickException(
                f"{problem}: start it, point [{table}] at another (exitwatch.toml(5)), or turn "
                "the kind off there (enabled = false)"
            )
    # Its removals and refusals go to the audit log as the agent's do.
    audit = AuditLog(config.audit_log, config.audit_max_bytes) if config.audit_log else None
    agent = Agent(config, kinds.values(), recorder=Recorder(audit))
    try:
        problems = agent.reconcile()
    finally:
        if audit is not None:
            audit.close()
    if problems:
        raise click.ClickException(
            "; ".join(problems) + "; the rest was reaped: fix that and run exitwatch reap again"
        )
    failed = agent.recorder.counters().get("removal_errors", 0)
    if failed:
        raise click.ClickException(
            f"{failed} removals failed; the log above says why: fix that and run exitwatch "
            "reap again (each removal had reap_attempts attempts)"
        )


@cli.command()
@opts.config_path
@opts.status_socket
@opts.spools
@click.option(
    "--json", "as_json", is_flag=True, help="The status as JSON (schema: exitwatch-files(5))."
)
@click.option(
    "--since",
    metavar="WHEN",
    help="Show removals from the audit log since WHEN: 90s, 30m, 12h, 7d, or a date.",
)
def status(config_path: str | None, as_json: bool, since: str | None, **flags: object) -> None:
    """Show what the agent watches and what it removed; exit 3 if no agent answers."""
    config = _config(config_path, **flags)
    from exitwatch.agent import audit
    from exitwatch.service.status.server import query
    from exitwatch.service.status.text import render

    doc = query(config.status_socket)
    code = 0
    if doc is None:
        # Only the scan needs the kinds (and the libraries under them): an agent's answer
        # is shown without them, in a fraction of the time.
        from exitwatch.service.status import build

        # Errors only: a warning for each bad marker would bury the status, which counts
        # them instead; `exitwatch reap --dry-run` names each.
        logs.setup("text", logging.ERROR)
        doc = build.of_scan(_kinds(config))
        code = NO_AGENT
    if since is not None:
        # The running agent's own audit log, whatever this command's config says.
        path = doc["agent"]["config"]["audit_log"] if doc.get("agent") else config.audit_log
        try:
            doc["reaps"] = list(audit.read(path, _since(since)))
        except OSError as err:
            raise click.ClickException(
                f"cannot read the audit log {path}: {err.strerror}{_audit_hint(err)}"
            ) from None
    click.echo(json.dumps(doc, indent=2) if as_json else render(doc))
    sys.exit(code)


@cli.command()
@opts.config_path
@opts.option(
    "--listen",
    metavar="PATH",
    help=f"The socket to serve when systemd passes none [default: {Adopt.listen}].",
)
@opts.option(
    "--docker-host",
    "adopt_docker_host",
    metavar="URL",
    help="The engine to forward to (default: the agent's docker_host, DOCKER_HOST, or the socket).",
)
@click.option(
    "--rule",
    "rules",
    multiple=True,
    metavar="GLOB",
    help="A command line that owns what its descendants create (repeatable; replaces the "
    "file's rules), e.g. '*/inspect eval *'.",
)
@click.option(
    "--container",
    "containers",
    multiple=True,
    metavar="GLOB",
    help="A container, by name or image, whose init owns what its clients create "
    "(repeatable; replaces the file's containers), e.g. 'runner-*'. A container labelled "
    "exitwatch.adopt=owner is one too.",
)
def adopt(config_path: str | None, listen: str | None, **flags: object) -> None:
    """Serve one labelling Docker socket for the whole host: each client's creations carry
    its owner, found from its process: the nearest process whose command line a rule
    matches; else, in a container meant to own (labelled exitwatch.adopt=owner, or named
    by --container), that container's init; else nobody.

    SIGTERM or SIGINT stops it; under exitwatch-adopt.socket, one socket file serves across
    restarts. exitwatch-adopt(8) has the recipes.
    """
    _require_root("exitwatch adopt", "its socket takes the engine socket's owner and group")
    config = _config(config_path)
    given = {
        "listen": listen,
        "docker_host": flags["adopt_docker_host"],
        "rules": flags["rules"],
        "containers": flags["containers"],
    }
    try:
        config = replace(
            config,
            adopt=replace(config.adopt, **{k: v for k, v in given.items() if v not in (None, ())}),
        )
        config.validate()
    except ConfigError as err:
        raise click.ClickException(str(err)) from None
    logs.setup(config.log_format)
    from exitwatch.adopt.service import AdoptError, Settings, serve
    from exitwatch.engine import url

    agents = config.kind("containers").docker_host  # the agent's engine
    try:
        engine = url.chosen(config.adopt.docker_host, agents)
    except url.EndpointError as err:  # DOCKER_HOST: the settings were checked
        raise click.ClickException(f"{url.ENV}: {err}") from None
    stopping = threading.Event()
    shutdown.on_signals({signal.SIGTERM: stopping.set, signal.SIGINT: stopping.set})
    try:
        adopt = config.adopt
        settings = Settings(adopt.listen, engine, adopt.rules, adopt.containers)
        serve(settings, stopping, os.environ)
    except AdoptError as err:
        raise click.ClickException(str(err)) from None


def _audit_hint(err: OSError) -> str:
    """What to do when the audit log cannot be read (a missing one reads as empty)."""
    if isinstance(err, PermissionError):
        return " (it is root's: run exitwatch status as root)"
    return ""


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


for command in (labels, mark, on_death_cmd, while_alive_cmd, watchdog_cmd, run):
    cli.add_command(command)


def main() -> None:
    cli(prog_name="exitwatch")
