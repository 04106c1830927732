"""The outcome comparison of the docker-py check (tests/dockerpy/check.py): each docker-py
test's outcome through a proxy against its outcome on the direct path.

Pure logic, no engine: tests/unit/test_dockerpy_compare.py tests it. The outcomes come from
the plugin that runs inside docker-py's pytest (plugin.py), one JSON file per path:
{nodeid: {"outcome": ..., "detail": ...}}.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

LABEL = "exitwatch.owner"  # the label both proxies add (exitwatch/contract.py's LABEL_OWNER)
ABSENT = "absent"  # a test one path ran and another did not


@dataclass(frozen=True)
class Result:
    outcome: str  # passed, failed, error, skipped, xfailed, xpassed (plugin.py)
    detail: str = ""  # the end of the failure's report, where it failed


@dataclass(frozen=True)
class Difference:
    test: str
    path: str
    direct: Result
    proxied: Result
    allowed: str = ""  # the reason it is allowed, or "" for a real difference
    flaky: str = ""  # how its reruns went, when they did not give the same difference

    def describe(self) -> str:
        line = f"{self.test}: direct {self.direct.outcome}, {self.path} {self.proxied.outcome}"
        if self.allowed:
            return f"{line} (allowed: {self.allowed})"
        if self.flaky:
            return f"{line} (not reproduced: {self.flaky})"
        detail = self.proxied.detail or self.direct.detail
        return f"{line}\n    {detail.strip().splitlines()[-1] if detail.strip() else ''}"


def load(path: Path) -> dict[str, Result]:
    """One path's outcomes, as plugin.py wrote them."""
    raw = json.loads(path.read_text())
    return {test: Result(r["outcome"], r.get("detail", "")) for test, r in raw.items()}


def differences(
    direct: Mapping[str, Result],
    proxied: Mapping[str, Mapping[str, Result]],
    allowed: Mapping[str, str],
) -> list[Difference]:
    """Every test whose outcome on a proxied path differs from the direct path's.

    A test of `allowed` (its nodeid, the reason) may fail through a proxy where it passed
    directly, but only when the failure names the label the proxy added: any other
    failure of the same test is a difference like any other."""
    found = []
    for path, outcomes in proxied.items():
        for test in sorted(set(direct) | set(outcomes)):
            d = direct.get(test, Result(ABSENT))
            p = outcomes.get(test, Result(ABSENT))
            if d.outcome == p.outcome:
                continue
            reason = ""
            if (
                test in allowed
                and d.outcome == "passed"
                and p.outcome == "failed"
                and LABEL in p.detail
            ):
                reason = allowed[test]
            found.append(Difference(test, path, d, p, reason))
    return found


def reproduced(d: Difference, direct: list[Result], proxied: list[Result]) -> Difference:
    """`d`, marked flaky unless every rerun of its test on the direct path gave the direct
    outcome again and every rerun on its proxied path the proxied outcome again."""
    if all(r.outcome == d.direct.outcome for r in direct) and all(
        r.outcome == d.proxied.outcome for r in proxied
    ):
        return d
    runs = "; ".join(
        f"{path} {', '.join(r.outcome for r in results)}"
        for path, results in (("direct", direct), (d.path, proxied))
    )
    return replace(d, flaky=f"reruns: {runs}")


def spans(path: Path) -> dict[str, tuple[float, float]]:
    """When each test of one path ran, as plugin.py wrote it: {nodeid: (start, stop)}."""
    raw = json.loads(path.read_text())
    return {t: (r["start"], r["stop"]) for t, r in raw.items() if "start" in r and "stop" in r}


def engine_time(created: str) -> float:
    """The epoch seconds of an engine's timestamp (`2026-12-04T21:10:00.123456789Z`,
    nanoseconds and all, which datetime cannot read)."""
    m = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)", created)
    if not m:
        raise ValueError(f"not an engine timestamp: {created!r}")
    zone = "+00:00" if m[3] == "Z" else m[3]
    whole = datetime.fromisoformat(m[1] + zone).timestamp()
    return whole + float(f"0.{m[2] or 0}")


def made_during(when: float, ran: Mapping[str, tuple[float, float]]) -> str:
    """The test that was running at `when`, or "" if none was."""
    for test, (start, stop) in ran.items():
        if start <= when <= stop:
            return test
    return ""


def counts(outcomes: Mapping[str, Result]) -> dict[str, int]:
    """How many tests had each outcome."""
    tally: dict[str, int] = {}
    for r in outcomes.values():
        tally[r.outcome] = tally.get(r.outcome, 0) + 1
    return dict(sorted(tally.items()))


def summary(
    direct: Mapping[str, Result],
    proxied: Mapping[str, Mapping[str, Result]],
    found: list[Difference],
    leftovers: Mapping[str, list[str]],
) -> tuple[int, int]:
    """(passed, failed) checks: one per test (it passed when its outcome on every proxied
    path is the direct path's, or an allowed difference, or one its reruns did not give
    again), and one per proxied path for
    what it left unlabelled on the engine."""
    tests = set(direct)
    for outcomes in proxied.values():
        tests |= set(outcomes)
    bad = {d.test for d in found if not d.allowed and not d.flaky}
    failed = len(bad) + sum(1 for path in proxied if leftovers.get(path))
    passed = len(tests - bad) + sum(1 for path in proxied if not leftovers.get(path))
    return passed, failed
