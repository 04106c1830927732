"""Fleet monitoring, as promtool sees it: the Prometheus rules pass its check and their
unit tests, every alert has a test, and the dashboard's queries parse. That every metric
they name is one a running agent exports is engine/test_fleet.py's."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from support.packaging import RULES, RULES_TEST
from support.packaging import dashboard_exprs as _dashboard_exprs


def _promtool(*args: str) -> str:
    # Debian's `prometheus` package carries it (the Makefile's APT_PACKAGES).
    if shutil.which("promtool") is None:
        pytest.fail("promtool is missing: apt-get install prometheus (see the Makefile)")
    done = subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"promtool {' '.join(args)}:\n{done.stdout}{done.stderr}"
    return done.stdout


def test_rules_pass_promtool_check() -> None:
    _promtool("check", "rules", str(RULES))


def test_rules_pass_their_unit_tests() -> None:
    _promtool("test", "rules", str(RULES_TEST))


def test_every_alert_has_a_unit_test() -> None:
    alerts = set(re.findall(r"^\s+- alert: (\w+)", RULES.read_text(), re.M))
    tested = set(re.findall(r"^\s+alertname: (\w+)", RULES_TEST.read_text(), re.M))
    assert alerts, "no alerts found"
    assert alerts <= tested, f"alerts without a test: {sorted(alerts - tested)}"
    # The six concerns, each with its alert.
    for needed in ("AgentDown", "PendingTooLong", "GivenUp", "Failing", "Engine", "Lost"):
        assert any(needed in a for a in alerts), needed
    assert "ExitwatchReconcileOverdue" in alerts


def test_dashboard_queries_parse(tmp_path: Path) -> None:
    """promtool parses PromQL in rules only, so each query becomes a recording rule; the
    dashboard's $instance variable becomes the regex that matches every host."""
    exprs = _dashboard_exprs()
    assert exprs
    lines = ["groups:", "  - name: dashboard", "    rules:"]
    for i, expr in enumerate(exprs):
        lines += [f"      - record: dashboard_query_{i}", f"        expr: {json.dumps(expr)}"]
    path = tmp_path / "dashboard.rules.yml"
    path.write_text("\n".join(lines).replace("$instance", ".*") + "\n")
    _promtool("check", "rules", str(path))
