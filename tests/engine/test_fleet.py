"""Fleet monitoring: every metric the Prometheus rules and the Grafana dashboard name is
one a running agent exports (scraped after a real reap). What promtool checks of them is
system/test_prometheus_rules.py's."""

from __future__ import annotations

import re

from exitwatch import mark_workdir

from support.agentproc import Agent, agent_argv, container, free_port, scrape, wait_gone
from support.packaging import RULES
from support.packaging import dashboard_exprs as _dashboard_exprs
from support.procs import kill, spawn_owner, wait_for

METRIC = re.compile(r"\bexitwatch_[a-z_]+\b")


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
