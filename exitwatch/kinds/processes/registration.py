"""What the leftover-process kind declares of itself (kinds/registry.py): its
`[processes]` settings, its health lines, what an owner holds of it in status, and its
metric."""

from __future__ import annotations

from dataclasses import dataclass

from exitwatch.kinds.base import Metric, Registration
from exitwatch.kinds.processes.kind import KIND, RESCAN_INTERVAL, Processes


@dataclass(frozen=True)
class Settings:
    """The `[processes]` table."""

    enabled: bool = True
    """Kill a dead `exitwatch run`'s leftover processes (EXITWATCH_OWNER and EXITWATCH_RUN
    in their environment)."""
    interval: float = RESCAN_INTERVAL
    """Seconds between two listings of /proc for a dead run's leftover processes."""

    def checks(self) -> dict[str, tuple[bool, str]]:
        return {"interval": (0.1 <= self.interval <= 3600, "a number in 0.1..3600")}


def _health_lines(rescans: dict) -> list[str]:
    if rescans.get("failing"):
        lines = [
            f"  leftover processes: rescan FAILING ({rescans['failing']} times in a row: "
            f"{rescans.get('last_error')})"
        ]
    else:
        lines = [f"  leftover processes: rescanned every {rescans['interval_s']:g} s"]
    if rescans.get("unreadable"):
        lines.append(
            f"  leftover processes: BLIND to {rescans['unreadable']} processes, whose owner "
            f"cannot be read ({rescans.get('last_unreadable')}): give the agent CAP_SYS_PTRACE"
        )
    return lines


REGISTRATION = Registration(
    kind=KIND,
    table="processes",
    settings=Settings,
    make=lambda settings: Processes(settings.interval),
    aliases={"kill_leftovers": "enabled", "leftovers_interval": "interval"},
    health_key="processes",
    health_lines=_health_lines,
    held=lambda held: sorted(r.name for r in held),
    metrics=(
        Metric(
            "exitwatch_processes_unreadable",
            "Processes whose owner the leftover-process kind could not read at its last "
            "rescan (no CAP_SYS_PTRACE); 0 while it sees every process, or is off.",
            "unreadable",
        ),
    ),
)
