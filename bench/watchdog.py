"""6b. Watchdogs: a hung owner's watchdog runs out -> its on-death hook has started, past the
timeout, by the benchmark's clock. The floor, timed in the same trial, is the hooks
section's path: an owner SIGKILLed by the benchmark -> its hook has started.

Each trial arms a watchdog (timeout WATCHDOG_TIMEOUT, no grace) on one owner that never
pets it, and kills a second owner itself; both owners' hooks stamp the wall clock as soon
as they run. What the watchdog adds to a death is the difference, per trial: seeing the
watchdog, waiting out its timeout to the look, and the SIGTERM.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time

from bench import stats
from bench.engine import Engine
from bench.hooks import STAMP, stamped
from bench.procs import Agent, AgentFailed, end_owners, set_environ, spawn_owners
from exitwatch import alive, on_death
from exitwatch.contract import ENV_HOOK_DIR
from exitwatch.kinds.spool.entry import ensure_spool

WATCHDOG_TIMEOUT = 1.0  # seconds: the shortest a watchdog may have


def run(engine: Engine, source: str, trials: int) -> dict:
    """Timeout-to-hook latencies of `trials` owners whose watchdog ran out, each paired with
    the SIGKILL-to-hook latency of an owner killed next to it."""
    work = tempfile.mkdtemp(prefix="exitwatch-bench-watchdog-")
    os.chmod(work, 0o755)
    spools = {name: os.path.join(work, name) for name in ("hooks", "watchdogs", "leases")}
    empty = os.path.join(work, "empty")
    for path in spools.values():
        ensure_spool(path)
    os.mkdir(empty)
    hung, killed = spawn_owners(trials), spawn_owners(trials)
    result: dict = {"source": source, "trials": trials, "timeout_s": WATCHDOG_TIMEOUT}
    env = {
        ENV_HOOK_DIR: spools["hooks"],
        alive.ENV_WATCHDOG_DIR: spools["watchdogs"],
        alive.ENV_LEASE_DIR: spools["leases"],
    }
    restore = set_environ(env)
    try:
        for i, (h, k) in enumerate(zip(hung, killed, strict=True)):
            on_death(["bash", "-c", STAMP, f"{work}/hung-{i}"], pid=h.proc.pid, timeout=10)
            on_death(["bash", "-c", STAMP, f"{work}/killed-{i}"], pid=k.proc.pid, timeout=10)
        agent = Agent(
            source,
            engine.host,
            [empty],
            hook_dir=spools["hooks"],
            watchdog_dir=spools["watchdogs"],
            lease_dir=spools["leases"],
        )
        late, floor, missed = [], [], 0
        try:
            agent.start()
            result["ready_s"] = round(agent.wait_ready(), 3)
            for i, (h, k) in enumerate(zip(hung, killed, strict=True)):
                at = time.time()
                k.kill()
                floor_started = stamped(f"{work}/killed-{i}")

                armed = time.time()
                alive.watchdog(WATCHDOG_TIMEOUT, pid=h.proc.pid, grace=0.0)
                started = stamped(f"{work}/hung-{i}")
                if started is None or floor_started is None:
                    missed += 1
                    continue
                late.append((started - armed - WATCHDOG_TIMEOUT) * 1000)
                floor.append((floor_started - at) * 1000)
        except AgentFailed as err:
            return result | {"unavailable": str(err)}
        finally:
            agent.stop()
    finally:
        restore()
        end_owners(hung + killed)
        shutil.rmtree(work, ignore_errors=True)
    return result | {
        "missed": missed,
        "late_ms": stats.summary(late),
        "kill_ms": stats.summary(floor),
        "overhead_ms": stats.paired(late, floor),
    }
