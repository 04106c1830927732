"""The docker-py check's outcome comparison (tests/dockerpy/compare.py): what counts as a
difference between the direct path and a proxied one, and the summary's counts."""

from __future__ import annotations

import json

from dockerpy.compare import (
    Result,
    counts,
    differences,
    engine_time,
    load,
    made_during,
    reproduced,
    summary,
)

PASS = Result("passed")
FAIL = Result("failed", "E   AssertionError: assert {'a': 'b'} == {'a': 'b'}\n")
LABELS_FAIL = Result(
    "failed",
    "E   AssertionError: assert {'a': 'b', 'exitwatch.owner': 'x:1:2'} == {'a': 'b'}\n",
)


def test_the_same_outcome_everywhere_is_no_difference() -> None:
    direct = {"t1": PASS, "t2": Result("skipped"), "t3": FAIL}
    proxied = {"adopt": dict(direct), "run": dict(direct)}
    assert differences(direct, proxied, {}) == []
    assert summary(direct, proxied, [], {}) == (3 + 2, 0)


def test_a_test_that_fails_only_through_a_proxy_is_a_difference() -> None:
    direct = {"t1": PASS, "t2": PASS}
    proxied = {"adopt": {"t1": PASS, "t2": FAIL}, "run": {"t1": PASS, "t2": PASS}}
    (d,) = differences(direct, proxied, {})
    assert (d.test, d.path, d.direct.outcome, d.proxied.outcome, d.allowed) == (
        "t2",
        "adopt",
        "passed",
        "failed",
        "",
    )
    assert "direct passed, adopt failed" in d.describe()
    assert summary(direct, proxied, [d], {}) == (1 + 2, 1)


def test_one_that_passes_only_through_a_proxy_differs_too() -> None:
    (d,) = differences({"t": FAIL}, {"run": {"t": PASS}}, {})
    assert (d.direct.outcome, d.proxied.outcome) == ("failed", "passed")


def test_a_test_missing_from_one_path_differs() -> None:
    found = differences({"t1": PASS}, {"run": {"t1": PASS, "t2": PASS}}, {})
    assert [(d.test, d.direct.outcome) for d in found] == [("t2", "absent")]
    found = differences({"t1": PASS, "t2": PASS}, {"run": {"t1": PASS}}, {})
    assert [(d.test, d.proxied.outcome) for d in found] == [("t2", "absent")]


def test_a_named_label_test_may_fail_through_a_proxy_when_the_label_is_why() -> None:
    allowed = {"t": "compares labels exactly"}
    found = differences({"t": PASS}, {"adopt": {"t": LABELS_FAIL}}, allowed)
    assert [d.allowed for d in found] == ["compares labels exactly"]
    assert summary({"t": PASS}, {"adopt": {"t": LABELS_FAIL}}, found, {}) == (2, 0)


def test_a_named_label_test_failing_for_another_reason_is_a_difference() -> None:
    allowed = {"t": "compares labels exactly"}
    (d,) = differences({"t": PASS}, {"adopt": {"t": FAIL}}, allowed)
    assert d.allowed == ""
    (d,) = differences({"t": PASS}, {"adopt": {"t": Result("error", LABELS_FAIL.detail)}}, allowed)
    assert d.allowed == ""


def test_an_unnamed_test_failing_on_the_label_is_still_a_difference() -> None:
    (d,) = differences({"t": PASS}, {"run": {"t": LABELS_FAIL}}, {"other": "reason"})
    assert d.allowed == ""


def test_leftovers_fail_their_path_check() -> None:
    direct = {"t": PASS}
    proxied = {"adopt": {"t": PASS}, "run": {"t": PASS}}
    left = {"adopt": [], "run": ["container x (abc)"]}
    assert summary(direct, proxied, [], left) == (2, 1)


def test_counts_and_load(tmp_path) -> None:
    f = tmp_path / "direct.json"
    f.write_text(
        json.dumps(
            {
                "a": {"outcome": "passed"},
                "b": {"outcome": "failed", "detail": "E   boom"},
                "c": {"outcome": "passed"},
            }
        )
    )
    got = load(f)
    assert got["b"] == Result("failed", "E   boom")
    assert counts(got) == {"failed": 1, "passed": 2}


def test_a_difference_its_reruns_give_again_stays() -> None:
    (d,) = differences({"t": PASS}, {"run": {"t": FAIL}}, {})
    same = reproduced(d, [PASS, PASS], [FAIL, FAIL])
    assert same.flaky == ""
    assert summary({"t": PASS}, {"run": {"t": FAIL}}, [same], {}) == (1, 1)


def test_a_difference_its_reruns_do_not_give_again_is_flaky_and_passes() -> None:
    (d,) = differences({"t": PASS}, {"run": {"t": FAIL}}, {})
    for direct, proxied in (([PASS, FAIL], [FAIL, FAIL]), ([PASS, PASS], [FAIL, PASS])):
        flaky = reproduced(d, direct, proxied)
        assert flaky.flaky.startswith("reruns: direct")
        assert summary({"t": PASS}, {"run": {"t": FAIL}}, [flaky], {}) == (2, 0)
    assert reproduced(d, [], []).flaky == ""  # no rerun proves nothing: it stays
    assert "not reproduced" in reproduced(d, [PASS], [PASS]).describe()


def test_a_leftover_is_named_by_the_test_that_ran_when_it_was_made() -> None:
    t = engine_time("2026-12-04T21:10:00.250000000Z")
    assert t == engine_time("2026-12-04T21:10:00Z") + 0.25
    assert engine_time("2026-12-04T22:10:00+01:00") == engine_time("2026-12-04T21:10:00Z")
    ran = {"a": (t - 10, t - 1), "b": (t - 1, t + 1)}
    assert made_during(t, ran) == "b"
    assert made_during(t + 5, ran) == ""
