"""What the lease kind declares of itself (kinds/registry.py): its `[leases]` settings, its
health lines and its metrics."""

from __future__ import annotations

from dataclasses import dataclass

from exitwatch.alive import LEASE_DIR
from exitwatch.kinds.base import Metric, Registration
from exitwatch.kinds.leases.kind import KIND, Leases


@dataclass(frozen=True)
class Settings:
    """The `[leases]` table."""

    enabled: bool = True
    """Run the leases of live owners (`exitwatch while-alive`), and remove those of dead ones."""
    dir: str = LEASE_DIR
    """The spool of leases (root's, mode 1733; the agent creates it)."""

    def checks(self) -> dict[str, tuple[bool, str]]:
        return {"dir": (self.dir.startswith("/"), "an absolute path")}


def _health_lines(health: dict) -> list[str]:
    line = (
        f"  leases: {health['leases']} followed, {health['running']} running; "
        f"{health['runs']} runs, {health['failures']} failed"
    )
    lines = [line]
    if health["failing"]:
        lines.append(f"  leases: {health['failing']} FAILING, the last: {health['last_failure']}")
    if health["unreadable"]:
        lines.append(
            f"  leases: {health['unreadable']} runs not made: whether the owner lives could "
            "not be read (see the log)"
        )
    return lines


REGISTRATION = Registration(
    kind=KIND,
    table="leases",
    settings=Settings,
    make=lambda settings: Leases(settings.dir),
    aliases={"lease_dir": "dir"},
    health_key="leases",
    health_lines=_health_lines,
    held_lines=lambda held: [f"    lease {h}" for h in held],
    metrics=(
        Metric("exitwatch_leases", "Leases followed now (their owners live).", "leases"),
        Metric("exitwatch_lease_runs_total", "Lease runs made (each run).", "runs", counter=True),
        Metric(
            "exitwatch_lease_failures_total",
            "Lease runs that failed to start, exited non-zero or timed out.",
            "failures",
            counter=True,
        ),
        Metric("exitwatch_leases_failing", "Leases whose last run failed.", "failing"),
        Metric(
            "exitwatch_lease_runs_unreadable_total",
            "Lease runs not made because whether the owner lives could not be read.",
            "unreadable",
            counter=True,
        ),
    ),
)
