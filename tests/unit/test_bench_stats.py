"""bench/stats.py: the only arithmetic between the measurements and the published figures."""

from __future__ import annotations

import pytest

from bench import stats


def test_quantile_is_nearest_rank_and_always_a_measured_value():
    values = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert stats.quantile(values, 0.5) == 3.0
    assert stats.quantile(values, 0.2) == 1.0  # ceil(0.2 * 5) = 1st
    assert stats.quantile(values, 0.21) == 2.0
    assert stats.quantile(values, 0.95) == 5.0
    assert stats.quantile(values, 0.0) == 1.0
    assert stats.quantile(values, 1.0) == 5.0
    assert stats.quantile([7.0], 0.99) == 7.0
    tenths = [i / 10 for i in range(1, 101)]
    assert all(stats.quantile(tenths, q) in tenths for q in (0.01, 0.333, 0.5, 0.999))


def test_quantile_does_not_reorder_its_input():
    values = [3.0, 1.0, 2.0]
    stats.quantile(values, 0.5)
    assert values == [3.0, 1.0, 2.0]


def test_summary_of_a_hundred_values():
    out = stats.summary([float(i) for i in range(100, 0, -1)])
    assert out == {"n": 100, "p50": 50.0, "p95": 95.0, "p99": 99.0, "max": 100.0, "mean": 50.5}


def test_summary_rounds_to_hundredths_and_is_empty_for_no_values():
    assert stats.summary([1.234567, 2.345678]) == {
        "n": 2,
        "p50": 1.23,
        "p95": 2.35,
        "p99": 2.35,
        "max": 2.35,
        "mean": 1.79,
    }
    assert stats.summary([]) == {"n": 0}


def test_paired_differences_are_taken_trial_by_trial():
    ours = [110.0, 60.0, 300.0, 90.0]
    floors = [100.0, 50.0, 280.0, 95.0]
    out = stats.paired(ours, floors)
    assert out == stats.summary([10.0, 10.0, 20.0, -5.0])
    assert (out["p50"], out["max"], out["mean"]) == (10.0, 20.0, 8.75)


def test_paired_follows_the_trial_not_the_rank():
    # The floor drifts between trials; ours costs 1 ms over the floor next to it, except in
    # one trial that costs 40 ms. Paired by rank, the drift would be taken for our cost.
    floors = [100.0, 50.0, 75.0]
    ours = [101.0, 90.0, 76.0]
    out = stats.paired(ours, floors)
    assert (out["p50"], out["max"]) == (1.0, 40.0)


def test_paired_quantiles_are_ordered_where_quantile_differences_are_not():
    ours = [10.0, 20.0, 30.0, 1000.0]
    floors = [0.0, 0.0, 0.0, 2000.0]
    by_quantile = {
        q: stats.quantile(ours, p) - stats.quantile(floors, p) for q, p in stats.QUANTILES
    }
    assert by_quantile["p99"] < by_quantile["p50"]  # what a difference of quantiles can do
    out = stats.paired(ours, floors)
    assert out["p50"] <= out["p95"] <= out["p99"] <= out["max"]
    assert (out["p50"], out["p95"], out["max"]) == (10.0, 30.0, 30.0)


def test_paired_needs_one_floor_per_trial():
    with pytest.raises(ValueError, match="3 trials against 2 floor trials"):
        stats.paired([1.0, 2.0, 3.0], [1.0, 2.0])
    assert stats.paired([], []) == {"n": 0}


def test_ratio_and_median():
    assert stats.ratio(1.0, 3.0) == 0.333
    assert stats.ratio(None, 3.0) is None
    assert stats.ratio(1.0, None) is None
    assert stats.ratio(1.0, 0) is None
    assert stats.median([3.0, 1.0, 2.0, 10.0]) == 2.0
