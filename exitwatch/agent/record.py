"""Record what happened: one structured log line per removal or refusal, the audit log,
counters, and the latency histogram."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import TypedDict

from exitwatch.agent.audit import AuditLog
from exitwatch.kinds.base import Outcome
from exitwatch.owner import Owner

log = logging.getLogger("exitwatch.reap")

RECENT = 50


@dataclass(frozen=True)
class Reap:
    time: float  # unix time
    what: str
    kind: str
    owner: str
    death: str
    latency_ms: float
    result: str
    ok: bool
    refused: bool
    dry_run: bool


class Recorder:
    """Counters, the recent removals, the audit log; safe to call from any thread."""

    def __init__(
        self,
        audit: AuditLog | None = None,
        observe: Callable[[str, float], None] | None = None,
    ) -> None:
        self.audit = audit
        self.observe = observe  # (kind, seconds) of each removal, for the histogram
        self.recent: deque[Reap] = deque(maxlen=RECENT)
        self._counters: Counter[str] = Counter()
        self._lock = threading.Lock()

    def count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counters[name] += n

    def counters(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counters)

    def reaps(self) -> list[Reap]:
        """The recent removals, oldest first."""
        with self._lock:
            return list(self.recent)

    def acted(self, owner: Owner, why: str, outcome: Outcome) -> None:
        """What a kind did to a live owner on its own (its watchdog ended it), `why`: a
        warning, an audit line and an entry of the recent list, as a removal's."""
        self._record(owner, why, outcome, 0.0, False, ("ended", logging.WARNING, None))

    def outcome(
        self, owner: Owner, death: str, outcome: Outcome, latency: float, dry_run: bool = False
    ) -> None:
        if outcome.refused:
            counter, verb, level = "refusals", "refused", logging.WARNING
        elif not outcome.ok:
            counter, verb, level = "removal_errors", "failed", logging.WARNING
        elif dry_run:
            counter, verb, level = f"would_reap_{outcome.kind}", "would reap", logging.INFO
        else:
            counter, verb, level = f"reaped_{outcome.kind}", "reaped", logging.INFO
        # The histogram first: whoever sees the counter move then sees the latency too.
        if self.observe is not None and outcome.ok and not dry_run:
            self.observe(outcome.kind, latency)
        self._record(owner, death, outcome, latency, dry_run, (verb, level, counter))

    def _record(
        self,
        owner: Owner,
        death: str,
        outcome: Outcome,
        latency: float,
        dry_run: bool,
        how: tuple[str, int, str | None],
    ) -> None:
        verb, level, counter = how
        reap = Reap(
            time=round(time.time(), 3),
            what=outcome.what,
            kind=outcome.kind,
            owner=str(owner),
            death=death,
            latency_ms=round(latency * 1000, 1),
            result=outcome.detail,
            ok=outcome.ok,
            refused=outcome.refused,
            dry_run=dry_run,
        )
        with self._lock:
            self.recent.append(reap)
            if counter is not None:
                self._counters[counter] += 1
            self._counters.update(outcome.counts)
        if self.audit is not None:
            self.audit.write(asdict(reap) | ({"extra": outcome.extra} if outcome.extra else {}))
        log.log(
            level,
            "%s %s owner=%s death=%r latency_ms=%.1f result=%r",
            verb,
            reap.what,
            reap.owner,
            reap.death,
            reap.latency_ms,
            reap.result,
            extra={"fields": {"event": verb.replace(" ", "_"), **asdict(reap)}},
        )


class Gauges(TypedDict):
    """What the metrics' gauges read of the loop (service/metrics.py)."""

    owners: int  # live owners holding resources (this machine's)
    resources: dict[str, int]  # of live owners, by kind; every kind, held or not
    pending: int  # removal jobs running or waiting to retry
    oldest_pending: float  # seconds since the oldest job's owner died, hooks aside
    last_reconcile: float  # unix time the last one ended; 0 before the first
    reconcile_interval: float  # 0: only at start
    elsewhere: int  # other machines' owners holding resources here, left alone


def gauges(
    owners: int,
    held: dict[str, int],
    pending: int,
    aging: Sequence[float],
    last_at: float | None,
    interval: float,
    elsewhere: int = 0,
) -> Gauges:
    """The gauges of the agent's loop, from what it counts: `aging` are the times (monotonic)
    the owners of the removals watched for hanging died, `last_at` when the last reconcile
    ended."""
    return {
        "owners": owners,
        "resources": held,
        "pending": pending,
        "oldest_pending": max((time.monotonic() - at for at in aging), default=0.0),
        "last_reconcile": round(last_at, 3) if last_at is not None else 0,
        "reconcile_interval": interval,
        "elsewhere": elsewhere,
    }
