"""What the workdir kind declares of itself (kinds/registry.py): its `[workdirs]` settings,
its health line and what an owner holds of it in status."""

from __future__ import annotations

from dataclasses import dataclass

from exitwatch.kinds.base import Registration
from exitwatch.kinds.workdirs import DEPTH
from exitwatch.kinds.workdirs.kind import KIND, Workdirs


@dataclass(frozen=True)
class Settings:
    """The `[workdirs]` table."""

    enabled: bool = True
    """Remove the workdirs marked (a .exitwatch-owner file) by a dead owner."""
    roots: tuple[str, ...] = ("/tmp", "/var/tmp")
    """Directories under which marked workdirs are looked for."""
    depth: int = DEPTH
    """How many levels below a root a workdir may be."""

    def checks(self) -> dict[str, tuple[bool, str]]:
        return {
            "roots": (all(r.startswith("/") for r in self.roots), "a list of absolute paths"),
            "depth": (1 <= self.depth <= 16, "an integer in 1..16"),
        }


def _health_lines(workdirs: dict) -> list[str]:
    discovery = workdirs.get("discovery")
    return [f"  workdirs: {discovery}"] if discovery else []


REGISTRATION = Registration(
    kind=KIND,
    table="workdirs",
    settings=Settings,
    make=lambda settings: Workdirs(settings.roots, settings.depth),
    aliases={"workdir_roots": "roots", "workdir_depth": "depth"},
    health_key="workdirs",
    health_lines=_health_lines,
    held=lambda held: sorted(r.key for r in held),
    held_lines=lambda held: [f"    workdir {w}" for w in held],
)
