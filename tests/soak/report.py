"""What the soak prints: the samples over time, the owners per kind with what became of
them, and one JSON summary."""

from __future__ import annotations

import json
import statistics
from collections import Counter
from collections.abc import Sequence

from .actor import Actor
from .sampling import Sample


def samples_table(samples: Sequence[Sample]) -> list[str]:
    columns: list[str] = []
    for s in samples:
        columns += [c for c in s.others if c not in columns]
    head = ["t (s)", "agent RSS (KiB)", "agent fds", "agent threads", *columns, "owners killed"]
    out = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for s in samples:
        cells = [f"{s.t:.0f}", s.rss, s.fds, s.threads, *(s.others.get(c, "") for c in columns)]
        out.append("| " + " | ".join(str(c) for c in [*cells, s.killed]) + " |")
    return out


def rows(actors: Sequence[Actor]) -> list[dict]:
    """One entry per table row: owners made, killed, leaks, wrong removals, hook runs."""
    out = []
    for actor in actors:
        leaks = Counter(o.row for o, _ in actor.left)
        row_of = {o.name: o.row for o in actor.live + actor.steady + actor.dead}
        wrong = Counter(row_of[name] for name, _ in actor.wrong)
        for row in actor.rows():
            out.append(
                {
                    "owners": row,
                    "made": actor.made[row],
                    "killed": actor.killed[row],
                    "leaks": leaks[row],
                    "wrong_removals": wrong[row],
                    "hook_runs": actor.hook_runs(row),
                }
            )
    return out


def rows_table(entries: Sequence[dict]) -> list[str]:
    head = ["owners", "made", "killed (SIGKILL)", "leaks", "wrong removals", "hook runs"]
    out = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for e in entries:
        runs = "—" if e["hook_runs"] is None else e["hook_runs"]
        cells = [e["owners"], e["made"], e["killed"], e["leaks"], e["wrong_removals"], runs]
        out.append("| " + " | ".join(str(c) for c in cells) + " |")
    return out


def ends(samples: Sequence[Sample]) -> dict:
    """The first and the last sample of each figure."""
    if not samples:
        return {}
    first, last = samples[0], samples[-1]
    out = {
        "agent_rss_kib": [first.rss, last.rss],
        "agent_fds": [first.fds, last.fds],
        "agent_threads": [first.threads, last.threads],
        "agent_rss_kib_max": max(s.rss for s in samples),
        "agent_fds_max": max(s.fds for s in samples),
        "agent_threads_max": max(s.threads for s in samples),
    }
    for column in {c for s in samples for c in s.others}:
        seen = [s.others[column] for s in samples if column in s.others]
        out[column] = [seen[0], seen[-1], max(seen)]
    return out


def spread(values: Sequence[float]) -> dict[str, float]:
    """p50, p95 and max of `values`, rounded to the ms (values in seconds, figures in ms)."""
    if not values:
        return {}
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
    return {
        "n": len(ordered),
        "p50_ms": round(statistics.median(ordered) * 1000, 1),
        "p95_ms": round(p95 * 1000, 1),
        "max_ms": round(ordered[-1] * 1000, 1),
    }


def summary(**fields: object) -> str:
    return json.dumps(fields, sort_keys=False)
