"""The end of the soak: the dead owners' resources given time to go, then what each actor's
contract says, the reap latencies per kind from the agent's audit log, and what the agent
logged and counted that a clean run never shows."""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Sequence

import docker

from exitwatch.agent import audit

from .actor import Actor, View
from .report import spread

# For the last deaths to be reaped: the slow user's last hooks take two rounds of 5 s, and
# the machine is shared.
REAP_DEADLINE = 90.0
# Counters of the agent that a clean soak leaves at 0: what a periodic reconcile found that
# the events had missed, a removal given up, a kind that could not be listed.
MUST_STAY_ZERO = ("reconcile_missed", "gave_up", "reconcile_errors")
_NUMBERS = re.compile(r"[0-9a-f]{32}|[0-9a-f-]{36}|\d+(\.\d+)?")
_LINE = re.compile(r"^\S+ \S+ (?P<level>[A-Z]+) (?P<logger>\S+): (?P<message>.*)$")


def settle(actors: Sequence[Actor], api: docker.APIClient, deadline: float) -> list[str]:
    """Wait until no dead owner's resource is left, for `deadline` seconds at most; what
    is left then, one line each."""
    end = time.monotonic() + deadline
    while True:
        view = View.now(api)
        left = [line for actor in actors for line in actor.leaks(view)]
        if not left or time.monotonic() > end:
            return left
        time.sleep(0.5)


def latencies(path: str, owners: set[str]) -> tuple[dict[str, dict], Counter[str]]:
    """Per kind, the spread of the agent's `latency_ms` over its removals of the soak's
    `owners` (from the death's first notice to the end of the removal job), from its audit
    log; and the refusals and failed attempts, by kind. The process kind is host-wide: the
    entries of other owners (other sessions' tests on a shared machine) are counted apart."""
    took: dict[str, list[float]] = {}
    other: Counter[str] = Counter()
    for entry in audit.read(path):
        kind = str(entry.get("kind"))
        if entry.get("owner") not in owners:
            other[f"{kind}, not the soak's owners"] += 1
        elif entry.get("refused"):
            other[f"{kind} refused"] += 1
        elif not entry.get("ok"):
            other[f"{kind} failed"] += 1
        elif not entry.get("dry_run"):
            took.setdefault(kind, []).append(float(entry["latency_ms"]) / 1000)
    return {kind: spread(values) for kind, values in sorted(took.items())}, other


def agent_log(text: str) -> tuple[Counter[str], list[str]]:
    """The agent's warnings, counted by logger and first words; and its errors and
    tracebacks, which a clean soak has none of, one line each."""
    warnings: Counter[str] = Counter()
    errors: list[str] = []
    for line in text.splitlines():
        match = _LINE.match(line)
        if match is None:
            if line.startswith("Traceback"):
                errors.append("agent traceback (see its log)")
            continue
        level, message = match["level"], match["message"]
        if level == "WARNING":
            warnings[f"{match['logger']}: {_shape(message)}"] += 1
        elif level in ("ERROR", "CRITICAL"):
            errors.append(f"agent {level.lower()}: {message[:300]}")
    return warnings, errors


def _shape(message: str) -> str:
    """A warning with its ids, numbers and quoted command left out, to count alike ones."""
    shape = _NUMBERS.sub("N", message)
    if shape.startswith(("failed ", "refused ", "reaped ")):  # a removal's: its kind
        return " ".join(shape.split()[:2])
    if "': " in shape:  # a hook's: its id and command quoted, then what happened
        shape = f"{shape.split()[0]} …: {shape.rsplit(chr(39) + ': ', 1)[1]}"
    return shape[:100]


def counted(counters: dict[str, int]) -> list[str]:
    return [
        f"agent counter {name} is {counters[name]}, not 0"
        for name in MUST_STAY_ZERO
        if counters.get(name)
    ]
