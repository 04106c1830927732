"""What the watchdog kind declares of itself (kinds/registry.py): its `[watchdogs]`
settings, its health lines and its metrics."""

from __future__ import annotations

from dataclasses import dataclass

from exitwatch.alive import WATCHDOG_DIR
from exitwatch.kinds.base import Metric, Registration
from exitwatch.kinds.watchdogs.kind import KIND, Watchdogs


@dataclass(frozen=True)
class Settings:
    """The `[watchdogs]` table."""

    enabled: bool = True
    """End an owner whose watchdog (`exitwatch watchdog`) went unpetted for its timeout."""
    dir: str = WATCHDOG_DIR
    """The spool of watchdogs (root's, mode 1733; the agent creates it)."""

    def checks(self) -> dict[str, tuple[bool, str]]:
        return {"dir": (self.dir.startswith("/"), "an absolute path")}


def _health_lines(health: dict) -> list[str]:
    lines = [
        f"  watchdogs: {health['armed']} armed; {health['fired']} owners ended "
        f"({health['killed']} with SIGKILL), {health['refused']} refused"
    ]
    for firing in health.get("recent", [])[-5:]:
        how = "SIGTERM, then SIGKILL" if firing["killed"] else "SIGTERM"
        lines.append(
            f"    ended owner {firing['owner']} after {firing['after_s']:g} s without a pet ({how})"
        )
    if health["unreadable"]:
        lines.append(
            f"  watchdogs: {health['unreadable']} looks could not be made, so none fired: "
            f"the last: {health['last_unreadable']}"
        )
    return lines


REGISTRATION = Registration(
    kind=KIND,
    table="watchdogs",
    settings=Settings,
    make=lambda settings: Watchdogs(settings.dir),
    aliases={"watchdog_dir": "dir"},
    health_key="watchdogs",
    health_lines=_health_lines,
    held_lines=lambda held: [f"    watchdog {h}" for h in held],
    metrics=(
        Metric("exitwatch_watchdogs_armed", "Watchdogs armed on live owners.", "armed"),
        Metric(
            "exitwatch_watchdog_fired_total",
            "Owners ended by their watchdog (SIGTERM sent).",
            "fired",
            counter=True,
        ),
        Metric(
            "exitwatch_watchdog_killed_total",
            "Owners ended by their watchdog that needed SIGKILL after their grace.",
            "killed",
            counter=True,
        ),
        Metric(
            "exitwatch_watchdog_unreadable_total",
            "Watchdog looks that could not be made (the owner's state or the pet file could "
            "not be read), so none fired.",
            "unreadable",
            counter=True,
        ),
    ),
)
