"""Prometheus metrics on an opt-in address, read from the agent's own counters at scrape
time so that they can never disagree with `exitwatch status`.

The metrics library is imported only when metrics are asked for: an agent without them
runs where the library is not installed.

The endpoint is reachable by every local user (and maybe the network), so no client may
cost the agent more than a bounded share: one thread serves every connection, at most
MAX_CONNECTIONS are open at once (more are closed as soon as they are accepted), and each
one has REQUEST_DEADLINE from its accept to the last byte of its answer, however slowly it
trickles its request in.
"""

from __future__ import annotations

import errno
import logging
import os
import selectors
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from exitwatch.kinds import registry
from exitwatch.service.config import parse_addr

log = logging.getLogger(__name__)

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
MAX_CONNECTIONS = 16  # a scraper needs one; a few spare for people with curl
REQUEST_DEADLINE = 5.0  # seconds from accept to the last byte answered
MAX_REQUEST = 8192  # bytes of request line and headers; nothing else is read
ACCEPT_PAUSE = 0.1  # seconds without accepting after the fd table was full

# name → (help, key in the agent's state). Counters only ever grow. Each kind adds its own
# (kinds/registry.py): the counters its removals move and the metrics of its health().
COUNTERS = {
    "exitwatch_exits_seen_total": ("Exit events read by the exit source.", "exits_seen"),
    "exitwatch_exit_hints_total": ("Exit hints about watched owners.", "exit_hints"),
    "exitwatch_events_lost_total": ("Times the kernel dropped exit events.", "events_lost"),
    "exitwatch_resyncs_total": ("Re-checks of every owner after lost hints.", "resyncs"),
    "exitwatch_removal_errors_total": ("Removals that failed.", "removal_errors"),
    "exitwatch_removals_given_up_total": ("Removals abandoned after every attempt.", "gave_up"),
    "exitwatch_refusals_total": ("Resources a safety check left alone.", "refusals"),
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
    "exitwatch_owners_elsewhere": (
        "Owners of other machines holding resources here, left alone.",
        "elsewhere",
    ),
    "exitwatch_removals_pending": ("Removals running or waiting to retry.", "pending"),
    "exitwatch_oldest_pending_removal_seconds": (
        "Age of the oldest removal (not hook) running or waiting to retry, from its owner's death.",
        "oldest_pending",
    ),
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


class Metrics:
    """Serves /metrics on `addr` from a daemon thread; `observe` feeds the histogram."""

    def __init__(self, addr: str, state: Callable[[], dict]) -> None:
        try:
            import prometheus_client
        except ImportError:
            raise MetricsError(
                f"cannot serve metrics on {addr}: the Python package prometheus_client is not "
                "installed (Debian: apt install python3-prometheus-client; pip: the "
                "exitwatch[metrics] extra)"
            ) from None
        host, port = parse_addr(addr) or ("", 0)
        self.registry = prometheus_client.CollectorRegistry()
        self._latency = prometheus_client.Histogram(
            "exitwatch_reap_latency_seconds",
            "From the owner's death being noticed to its resource being removed.",
            ["kind"],
            buckets=LATENCY_BUCKETS,
            registry=None,
        )
        # A scrape collects in registration order and is no snapshot; the record feeds the
        # histogram before the counter, so the counters are read first: a scrape that shows a
        # reap counted shows its latency too.
        self.registry.register(_StateCollector(state))
        self.registry.register(self._latency)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            sock = socket.create_server((host, port), family=family, backlog=MAX_CONNECTIONS)
        except OSError as err:
            raise MetricsError(
                f"cannot serve metrics on {addr}: {err.strerror}: give --metrics-addr (or "
                "metrics_addr) a free HOST:PORT"
            ) from None
        self._server = _Server(sock, self._answer)
        self._thread = threading.Thread(
            target=self._server.serve, name="exitwatch-metrics", daemon=True
        )
        self._thread.start()
        log.info("metrics on http://%s/metrics", addr)

    def observe(self, kind: str, seconds: float) -> None:
        self._latency.labels(kind).observe(seconds)

    def close(self) -> None:
        self._server.stop()
        self._thread.join(1.0)
        self._server.close()

    def _answer(self, request: bytes) -> bytes:
        """The whole HTTP response to one request (its line and headers)."""
        from prometheus_client.exposition import choose_encoder

        head, *header_lines = request.decode("latin-1").split("\r\n")
        method, _, rest = head.partition(" ")
        path = rest.partition(" ")[0].partition("?")[0]
        if method not in ("GET", "HEAD"):
            return _response("405 Method Not Allowed", b"GET or HEAD only\n")
        if path not in ("/", "/metrics"):
            return _response("404 Not Found", b"metrics are on /metrics\n")
        headers = dict(line.lower().partition(":")[::2] for line in header_lines if line)
        encoder, content_type = choose_encoder(headers.get("accept", "").strip())
        try:
            body = encoder(self.registry)
        except TimeoutError:  # a wedged loop fails the scrape rather than lie
            return _response("503 Service Unavailable", b"the agent's loop did not answer\n")
        response = _response("200 OK", body, content_type)
        return response[: len(response) - len(body)] if method == "HEAD" else response


def _response(status: str, body: bytes, content_type: str = "text/plain; charset=utf-8") -> bytes:
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode("latin-1") + body


class _Conn:
    def __init__(self, sock: socket.socket, now: float) -> None:
        self.sock = sock
        self.deadline = now + REQUEST_DEADLINE
        self.request = b""
        self.response: memoryview | None = None


class _Server:
    """One thread, one selector: every connection is a few bytes of state and one fd."""

    def __init__(self, sock: socket.socket, answer: Callable[[bytes], bytes]) -> None:
        sock.setblocking(False)
        self._sock, self._answer = sock, answer
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._conns: dict[int, _Conn] = {}
        self._sel = selectors.DefaultSelector()
        self._paused_until = 0.0

    def stop(self) -> None:
        os.write(self._wake_w, b"x")

    def close(self) -> None:
        for conn in list(self._conns.values()):
            self._drop(conn)
        self._sel.close()
        self._sock.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def serve(self) -> None:
        self._sel.register(self._wake_r, selectors.EVENT_READ)
        self._sel.register(self._sock, selectors.EVENT_READ)
        listening = True
        while True:
            now = time.monotonic()
            for conn in [c for c in self._conns.values() if c.deadline <= now]:
                self._drop(conn)
            if not listening and now >= self._paused_until:
                self._sel.register(self._sock, selectors.EVENT_READ)
                listening = True
            wakes = [c.deadline for c in self._conns.values()]
            if not listening:
                wakes.append(self._paused_until)
            timeout = max(0.0, min(wakes) - now) if wakes else None
            for key, events in self._sel.select(timeout):
                if key.fileobj == self._wake_r:
                    return
                if key.fileobj is self._sock:
                    if not self._accept():
                        self._sel.unregister(self._sock)
                        self._paused_until = time.monotonic() + ACCEPT_PAUSE
                        listening = False
                elif key.data is not None:
                    self._serve_one(key.data, events)

    def _accept(self) -> bool:
        """Accept what is waiting; False when the fd table is full (accept again later:
        the pending connections keep the socket readable, and would spin the loop)."""
        for _ in range(MAX_CONNECTIONS):
            try:
                sock, _ = self._sock.accept()
            except BlockingIOError:
                return True
            except OSError as err:
                if err.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    return False
                continue  # ECONNABORTED and the like: that client's loss
            if len(self._conns) >= MAX_CONNECTIONS:  # no slot: its fd back at once
                sock.close()
                continue
            sock.setblocking(False)
            conn = _Conn(sock, time.monotonic())
            self._conns[sock.fileno()] = conn
            self._sel.register(sock, selectors.EVENT_READ, conn)
        return True

    def _serve_one(self, conn: _Conn, events: int) -> None:
        try:
            if conn.response is None:
                chunk = conn.sock.recv(MAX_REQUEST)
                if not chunk:
                    self._drop(conn)
                    return
                conn.request += chunk
                end = conn.request.find(b"\r\n\r\n")
                if end < 0:
                    if len(conn.request) > MAX_REQUEST:
                        self._drop(conn)
                    return
                conn.response = memoryview(self._answer(conn.request[:end]))
                self._sel.modify(conn.sock, selectors.EVENT_WRITE, conn)
            sent = conn.sock.send(conn.response)
            conn.response = conn.response[sent:]
            if not conn.response:
                self._drop(conn)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(conn)  # the client went away: its loss, and nothing to log
        except Exception:  # a bug in building the answer: say so once per request, go on
            log.exception("metrics: cannot answer a scrape")
            self._drop(conn)

    def _drop(self, conn: _Conn) -> None:
        self._conns.pop(conn.sock.fileno(), None)
        self._sel.unregister(conn.sock)
        conn.sock.close()


class _StateCollector:
    def __init__(self, state: Callable[[], dict]) -> None:
        self._state = state

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

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
        for reg in registry.KINDS:
            for key, text in reg.counters.items():
                yield CounterMetricFamily(f"exitwatch_{key}", text, value=state.get(key, 0))
            health = state["health"].get(reg.kind, {})
            for metric in reg.metrics:
                family = CounterMetricFamily if metric.counter else GaugeMetricFamily
                name = metric.name.removesuffix("_total") if metric.counter else metric.name
                if metric.each is None:
                    yield family(name, metric.help, value=float(health.get(metric.key) or 0))
                    continue
                entries, by, label = metric.each
                series = family(name, metric.help, labels=[label])
                for entry in health.get(entries) or ():
                    series.add_metric([str(entry.get(by))], float(entry.get(metric.key) or 0))
                yield series
        held = GaugeMetricFamily(
            "exitwatch_resources_watched", "Resources of live owners, by kind.", labels=["kind"]
        )
        for kind, n in sorted(state["resources"].items()):
            held.add_metric([kind], n)
        yield held
