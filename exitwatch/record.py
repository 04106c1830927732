"""Record what happened: one structured log line per removal, and counters."""

from __future__ import annotations

import logging
import threading
from collections import Counter, deque
from dataclasses import dataclass, field

from exitwatch.owner import Owner
from exitwatch.resources.base import Outcome

log = logging.getLogger("exitwatch.reap")


@dataclass(frozen=True)
class Reap:
    what: str
    kind: str
    owner: str
    death: str
    latency_ms: float
    result: str
    ok: bool


@dataclass
class Recorder:
    """Counters and the recent removals; safe to call from any thread."""

    recent: deque[Reap] = field(default_factory=lambda: deque(maxlen=50))
    counters: Counter[str] = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.counters[name] += n

    def outcome(
        self, owner: Owner, death: str, outcome: Outcome, latency: float, dry_run: bool = False
    ) -> None:
        reap = Reap(
            what=outcome.what,
            kind=outcome.kind,
            owner=str(owner),
            death=death,
            latency_ms=round(latency * 1000, 1),
            result=outcome.detail,
            ok=outcome.ok,
        )
        with self._lock:
            self.recent.append(reap)
            if outcome.refused:
                self.counters["refusals"] += 1
            elif not outcome.ok:
                self.counters["removal_errors"] += 1
            elif dry_run:
                self.counters[f"would_reap_{outcome.kind}"] += 1
            else:
                self.counters[f"reaped_{outcome.kind}"] += 1
        level = logging.INFO if outcome.ok else logging.WARNING
        if outcome.refused:
            verb = "refused"
        elif not outcome.ok:
            verb = "failed"
        else:
            verb = "would reap" if dry_run else "reaped"
        log.log(
            level,
            "%s %s owner=%s death=%r latency_ms=%.1f result=%r",
            verb,
            reap.what,
            reap.owner,
            reap.death,
            reap.latency_ms,
            reap.result,
        )
