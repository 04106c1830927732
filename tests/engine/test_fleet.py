"""Fleet monitoring: the Prometheus rules pass promtool's check and their unit tests, every
alert has a test, the dashboard's queries parse, and every metric the rules and the
dashboard name is one a running agent exports (scraped after a real reap)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from exitwatch import mark_workdir

from support.agentproc import Agent, agent_argv, container, free_port, scrape, wait_gone
from support.procs import kill, spawn_owner, wait_for

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "packaging" / "prometheus" / "exitwatch.rules.yml"
RULES_TEST = ROOT / "packaging" / "prometheus" / "exitwatch.rules.test.yml"
DASHBOARD = ROOT / "packaging" / "grafana" / "exitwatch.json"
METRIC = re.compile(r"\bexitwatch_[a-z_]+\b")


def _promtool(*args: str) -> str:
    # Debian's `prometheus` package carries it (the Makefile's APT_PACKAGES).
    if shutil.which("promtool") is None:
        pytest.fail("promtool is missing: apt-get install prometheus (see the Makefile)")
    done = subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"promtool {' '.join(args)}:\n{done.stdout}{done.stderr}"
    return done.stdout


def _dashboard_exprs() -> list[str]:
    doc = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in doc["panels"] for t in p.get("targets", [])]


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


def _exported(text: str) -> set[str]:
    """The sample names in a /metrics page."""
    return {
        re.split(r"[{ ]", line, maxsplit=1)[0]
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


def test_every_metric_named_is_exported_by_a_running_agent(engine, workroot, tmp_path) -> None:
    named = set(METRIC.findall(RULES.read_text()))
    for expr in _dashboard_exprs():
        named |= set(METRIC.findall(expr))
    alive = spawn_owner()
    held = workroot / "held"
    held.mkdir()
    mark_workdir(held, alive.pid)
    port = free_port()
    argv = agent_argv(
        "netlink", engine.host, workroot, extra=("--metrics-addr", f"127.0.0.1:{port}")
    )
    agent = Agent(argv, tmp_path / "agent.log")
    try:
        agent.wait_log("ready:")
        # A reap of each kind (and the live owner's workdir), so that the series with a
        # `kind` label have samples too.
        owner = spawn_owner()
        path = workroot / "w"
        path.mkdir()
        mark_workdir(path, owner.pid)
        cid = container(engine, owner.pid)
        agent.wait_holding(owner.pid, containers=1, workdirs=1)
        agent.wait_holding(alive.pid, workdirs=1)
        kill(owner)
        wait_gone(engine, [cid], [path])

        def reaped() -> str | None:
            text = scrape(port)
            return text if 'exitwatch_reaped_total{kind="workdir"} 1.0' in text else None

        exported = _exported(wait_for(reaped, what="the reap in the metrics"))
    finally:
        agent.stop()
        kill(alive)
    assert named, "no metric named"
    assert named <= exported, f"named but not exported: {sorted(named - exported)}"
