"""What the agent reads of its configuration: service/config.py's Config is one such. The
agent names the fields it needs rather than import the service's config, which lies above it."""

from __future__ import annotations

from typing import Protocol


class Settings(Protocol):
    @property
    def dry_run(self) -> bool:
        """Log what would be removed; remove nothing."""
        ...

    @property
    def reap_workers(self) -> int:
        """Removals run in parallel on this many threads."""
        ...

    @property
    def reap_attempts(self) -> int:
        """A removal that fails is tried this many times in all: the agent's attempts,
        each of which may try an engine call more than once (kinds/docker/attempts.py)."""
        ...

    @property
    def reconcile_interval(self) -> float:
        """Seconds between periodic reconciles; 0: only at start."""
        ...
