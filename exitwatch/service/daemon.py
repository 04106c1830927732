"""One run of the agent as a service: its source, kinds, audit log, status socket, metrics
and systemd notifications, wired together and torn down within a deadline."""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import asdict

from exitwatch import __version__
from exitwatch.agent.audit import AuditLog
from exitwatch.agent.loop import Agent
from exitwatch.agent.record import Recorder
from exitwatch.kinds import registry
from exitwatch.kinds.base import ResourceKind
from exitwatch.owner import current_machine
from exitwatch.service.config import Config, ConfigError
from exitwatch.service.status import build
from exitwatch.service.status.schema import AgentInfo
from exitwatch.service.status.server import StatusServer
from exitwatch.service.systemd import Notifier
from exitwatch.sources import pick

log = logging.getLogger(__name__)


def make_kinds(config: Config) -> dict[str, ResourceKind]:
    """The kinds that are on, by name, in the registry's order.

    Raises ConfigError for settings that a kind refuses when it is made (an engine that is
    not a local socket, which DOCKER_HOST may name)."""
    kinds = {}
    for reg in registry.KINDS:
        settings = config.kind(reg.table)
        if not settings.enabled:
            continue
        try:
            kinds[reg.kind] = reg.make(settings)
        except ValueError as err:
            raise ConfigError(f"{reg.table}.{err}") from None
        kinds[reg.kind].dry_run = config.dry_run
    return kinds


class Service:
    def __init__(self, config: Config, started: float) -> None:
        self.config = config
        self.started = started  # unix time the process started, kept across reloads
        self.notifier = Notifier()
        self._agent: Agent | None = None
        self._stop_requested = threading.Event()
        self._stop_at = 0.0
        # Set by stop() for good: no reload runs after it, and systemd is told STOPPING=1.
        self.stopping = threading.Event()
        # Whether the run ends for a reload: systemd is then told RELOADING=1, not
        # STOPPING=1, which it takes for a stop it did not ask, ended with SIGKILL.
        self._reloading = False

    def stop(self) -> None:
        """Make run() return, and the process end; callable from any thread (not a signal
        handler: see shutdown.on_signals)."""
        self.stopping.set()
        self._end_run()

    def reload(self) -> None:
        """Make run() return for another run() with the config read again; callable from
        any thread (not a signal handler)."""
        self._reloading = True
        self._end_run()

    def _end_run(self) -> None:
        self._stop_at = time.monotonic()
        self._stop_requested.set()
        agent = self._agent  # once: run() may set it to None between two reads
        if agent is not None:
            agent.stop()

    def rearm(self) -> None:
        """Forget a reload that has been handled, before run() is called again. A stop() or
        reload() after this makes the next run() return at once."""
        self._reloading = False
        self._stop_requested.clear()

    def run(self, deadline: float) -> int:
        """Run until stop(); how many removals under way were abandoned at the deadline
        (counted from stop())."""
        config = self.config
        source, why = pick(
            config.source,
            poll_interval=config.poll_interval,
            ebpf_max_owners=config.ebpf_max_owners,
        )
        log.info("exitwatch %s starting: %s", __version__, config.describe())
        log.info("exit source %s", why)
        _log_machine()
        audit = AuditLog(config.audit_log, config.audit_max_bytes) if config.audit_log else None
        recorder = Recorder(audit)
        kinds = make_kinds(config)
        agent = Agent(
            config,
            kinds.values(),
            source,
            recorder,
            watchdog=self.notifier.ping,
            watchdog_interval=self.notifier.watchdog_interval,
        )
        info: AgentInfo = {
            "version": __version__,
            "pid": os.getpid(),
            "started_at": self.started,
            "source": source.name,
            "source_reason": why,
            "dry_run": config.dry_run,
            "config": asdict(config),
        }
        closers = []
        try:
            if config.metrics_addr:
                from exitwatch.service.metrics import Metrics

                metrics = Metrics(config.metrics_addr, lambda: _metrics_state(agent, kinds))
                recorder.observe = metrics.observe
                closers.append(metrics.close)
            server = StatusServer(
                config.status_socket, lambda: build.of_agent(agent, kinds, recorder, info)
            )
            closers.append(server.close)
            self._agent = agent
            if self._stop_requested.is_set():
                agent.stop()
            self.notifier.send(f"READY=1\nSTATUS=following exits with {source.name}")
            agent.run()
            if self._reloading and not self.stopping.is_set():
                # The same process runs on; READY=1 at the next run() ends the reload
                # (sd_notify(3): RELOADING=1 with the time it began).
                usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
                self.notifier.send(f"RELOADING=1\nMONOTONIC_USEC={usec}")
            else:
                self.notifier.send("STOPPING=1")
            # No one is served while the removals under way finish: they get the time.
            while closers:
                closers.pop()()
            left = max(0.0, deadline - (time.monotonic() - self._stop_at))
            abandoned = agent.drain(left)
            if abandoned:
                log.warning(
                    "%d removals under way abandoned at shutdown; a restart redoes them", abandoned
                )
            return abandoned
        finally:
            self._agent = None
            while closers:
                closers.pop()()
            if audit is not None:
                audit.close()


def _log_machine() -> None:
    """Which machine this agent judges the owners of: those of any other are left alone."""
    try:
        machine, where = current_machine()
    except OSError as err:
        log.warning("cannot read the machine id now (%s); read again when needed", err)
        return
    if machine:
        log.info("machine id %s (%s): other machines' owners are left alone", machine, where)
    else:
        log.warning(
            "no machine id (%s): owners made here are written without one, and owners "
            "that name a machine and another boot are left alone",
            where,
        )


def _metrics_state(agent: Agent, kinds: dict[str, ResourceKind]) -> dict:
    """The agent's counters and gauges, and each kind's health (none for a kind that is
    off), as service/metrics.py reads them."""
    counters = agent.counters()
    return {
        **counters,
        **agent.ask(agent.gauges),  # a wedged loop fails the scrape rather than lie
        "reaped": {
            k.removeprefix("reaped_"): v for k, v in counters.items() if k.startswith("reaped_")
        },
        "health": {
            reg.kind: kinds[reg.kind].health() for reg in registry.KINDS if reg.kind in kinds
        },
    }
