"""What the hook kind declares of itself (kinds/registry.py): its `[hooks]` settings and
the counters its runs move."""

from __future__ import annotations

from dataclasses import dataclass

from exitwatch.contract import HOOK_DIR
from exitwatch.kinds.base import Registration
from exitwatch.kinds.hooks.kind import KIND, Hooks


@dataclass(frozen=True)
class Settings:
    """The `[hooks]` table."""

    enabled: bool = True
    """Run the on-death hooks of dead owners (`exitwatch on-death`)."""
    dir: str = HOOK_DIR
    """The spool of on-death hooks (root's, mode 1733; the agent creates it)."""

    def checks(self) -> dict[str, tuple[bool, str]]:
        return {"dir": (self.dir.startswith("/"), "an absolute path")}


REGISTRATION = Registration(
    kind=KIND,
    table="hooks",
    settings=Settings,
    make=lambda settings: Hooks(settings.dir),
    aliases={"hook_dir": "dir"},
    held_lines=lambda held: [f"    hook {h}" for h in held],
    counters={
        "hook_runs": "On-death hooks run (each attempt).",
        "hook_failures": "On-death hook runs that failed to start or exited non-zero.",
        "hook_timeouts": "On-death hooks killed at their timeout.",
    },
)
