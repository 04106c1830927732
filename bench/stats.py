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


def minus(ours: dict[str, float | int], floor: dict[str, float | int]) -> dict[str, float]:
    """Quantile by quantile: ours - floor. The trials are not paired, their quantiles are."""
    return {
        k: round(float(ours[k]) - float(floor[k]), 2)
        for k in ("p50", "p95", "p99", "max")
        if k in ours and k in floor
    }


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return round(a / b, 3)


def median(values: Sequence[float]) -> float:
    return quantile(values, 0.5)
