"""Distributions and ratios, the only numbers the report shows."""

from __future__ import annotations

import math
from collections.abc import Sequence

QUANTILES = (("p50", 0.50), ("p95", 0.95), ("p99", 0.99))


def quantile(values: Sequence[float], q: float) -> float:
    """Nearest-rank quantile: always a value that was measured."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def summary(values_ms: Sequence[float]) -> dict[str, float | int]:
    """n, p50, p95, p99, max and mean of latencies in ms; only n (0) when there are none."""
    if not values_ms:
        return {"n": 0}
    out: dict[str, float | int] = {"n": len(values_ms)}
    for name, q in QUANTILES:
        out[name] = round(quantile(values_ms, q), 2)
    out["max"] = round(max(values_ms), 2)
    out["mean"] = round(sum(values_ms) / len(values_ms), 2)
    return out


def paired(ours: Sequence[float], floors: Sequence[float]) -> dict[str, float | int]:
    """The summary of per-trial differences ours[i] - floors[i]: each trial of ours against
    the floor trial run next to it, so a floor that drifts during a run drifts out of the
    difference. Unlike a difference of two quantiles, its quantiles are ordered."""
    if len(ours) != len(floors):
        raise ValueError(f"{len(ours)} trials against {len(floors)} floor trials")
    return summary([a - b for a, b in zip(ours, floors, strict=True)])


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return round(a / b, 3)


def median(values: Sequence[float]) -> float:
    return quantile(values, 0.5)
