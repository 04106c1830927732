"""Prometheus metrics on an opt-in address, read from the agent's own counters at scrape
time so that they can never disagree with `exitwatch status`."""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Iterator
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Histogram, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from exitwatch.config import parse_addr

log = logging.getLogger(__name__)

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)

# name → (help, key in the agent's state). Counters only ever grow.
COUNTERS = {
    "exitwatch_exits_seen_total": ("Exit events read by the exit source.", "exits_seen"),
    "exitwatch_exit_hints_total": ("Exit hints about watched owners.", "exit_hints"),
    "exitwatch_events_lost_total": ("Times the kernel dropped exit events.", "events_lost"),
    "exitwatch_resyncs_total": ("Re-checks of every owner after lost hints.", "resyncs"),
    "exitwatch_removal_errors_total": ("Removals that failed.", "removal_errors"),
    "exitwatch_removals_given_up_total": ("Removals abandoned after every attempt.", "gave_up"),
    "exitwatch_refusals_total": ("Resources a safety check left alone.", "refusals"),
    "exitwatch_engine_reconnects_total": ("Docker events stream reconnects.", "reconnects"),
    "exitwatch_reconciles_total": ("Full listings done, at start and periodic.", "reconciles"),
    "exitwatch_reconcile_missed_total": (
        "Resources a periodic reconcile found that the index did not hold.",
        "reconcile_missed",
    ),
    "exitwatch_reconcile_errors_total": (
        "Periodic reconciles in which a kind could not be listed.",
        "reconcile_errors",
    ),
}
GAUGES = {
    "exitwatch_owners_watched": ("Live owners holding resources.", "owners"),
    "exitwatch_removals_pending": ("Removals running or waiting to retry.", "pending"),
    "exitwatch_oldest_pending_removal_seconds": (
        "Age of the oldest removal running or waiting to retry, from its owner's death.",
        "oldest_pending",
    ),
    "exitwatch_engine_connected": ("1 while the Docker engine answers.", "engine_connected"),
    "exitwatch_last_reconcile_timestamp_seconds": (
        "Unix time the last reconcile ended; 0 before the first.",
        "last_reconcile",
    ),
    "exitwatch_reconcile_interval_seconds": (
        "Seconds between periodic reconciles; 0: only at start.",
        "reconcile_interval",
    ),
}


class MetricsError(Exception):
    pass


class _Quiet(WSGIRequestHandler):
    timeout = 2  # a client that sends nothing holds a thread this long, no more

    def log_message(self, format: str, *args: object) -> None:
        pass


class _Server(ThreadingMixIn, WSGIServer):
    # A thread per scrape, so an idle client blocks neither scrapes nor shutdown.
    daemon_threads = True


class _Server6(_Server):
    address_family = socket.AF_INET6


class Metrics:
    """Serves /metrics on `addr` from a daemon thread; `observe` feeds the histogram."""

    def __init__(self, addr: str, state: Callable[[], dict]) -> None:
        host, port = parse_addr(addr) or ("", 0)
        self.registry = CollectorRegistry()
        self._latency = Histogram(
            "exitwatch_reap_latency_seconds",
            "From the owner's death being noticed to its resource being removed.",
            ["kind"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(_StateCollector(state))
        server_class = _Server6 if ":" in host else _Server
        try:
            self._server = make_server(
                host, port, make_wsgi_app(self.registry), server_class, _Quiet
            )
        except OSError as err:
            raise MetricsError(f"cannot serve metrics on {addr}: {err.strerror}") from None
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="exitwatch-metrics", daemon=True
        )
        self._thread.start()
        log.info("metrics on http://%s/metrics", addr)

    def observe(self, kind: str, seconds: float) -> None:
        self._latency.labels(kind).observe(seconds)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class _StateCollector:
    def __init__(self, state: Callable[[], dict]) -> None:
        self._state = state

    def collect(self) -> Iterator[object]:
        state = self._state()
        for name, (text, key) in COUNTERS.items():
            yield CounterMetricFamily(name.removesuffix("_total"), text, value=state[key])
        reaped = CounterMetricFamily(
            "exitwatch_reaped", "Resources removed, by kind.", labels=["kind"]
        )
        for kind, n in sorted(state["reaped"].items()):
            reaped.add_metric([kind], n)
        yield reaped
        for name, (text, key) in GAUGES.items():
            yield GaugeMetricFamily(name, text, value=state[key])
        held = GaugeMetricFamily(
            "exitwatch_resources_watched", "Resources of live owners, by kind.", labels=["kind"]
        )
        for kind, n in sorted(state["resources"].items()):
            held.add_metric([kind], n)
        yield held
