"""3. Idle cost: the agent watching many live owners that do nothing, and their containers
(created, not started)."""

from __future__ import annotations

import time

from bench.engine import Engine
from bench.procs import Agent, CpuMeter, Runner, rss_mb

SETTLE = 5.0  # seconds after "ready:" before measuring, so start-up work is not counted


def run(engine: Engine, owners: list[Runner], per_owner: int, seconds: float, root: str) -> dict:
    """The caller's `owners` are alive and stay so; their containers are left for scale."""
    engine.create_for([o.owner for o in owners], per_owner)
    with Agent("auto", engine.host, [root]) as agent:
        figures = measure(agent, seconds)
    return {"owners": len(owners), "containers": len(owners) * per_owner, **figures}


def measure(agent: Agent, seconds: float) -> dict:
    """A started agent's CPU over `seconds`, from SETTLE s after its "ready:", then its RSS."""
    ready = agent.wait_ready()
    time.sleep(SETTLE)
    meter = CpuMeter(agent.pid)
    meter.begin()
    start = time.monotonic()
    time.sleep(seconds)
    cpu = meter.end()
    wall = time.monotonic() - start
    rss, hwm = rss_mb(agent.pid)
    return {
        "watching": agent.watching(),
        "ready_s": round(ready, 3),
        "seconds": round(wall, 1),
        "cpu_pct": round(cpu / wall * 100, 3),
        "rss_mb": rss,
        "rss_peak_mb": hwm,
    }
