"""5. On-death hooks: owner SIGKILL -> its hook's command has started, by the benchmark's
clock. The floor, timed in the same loop, is a plain fork+exec of the same command.

The command stamps the wall clock as soon as it runs (bash's $EPOCHREALTIME, no further
fork), so both figures end at the same point of the same program.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time

from bench import stats
from bench.engine import Engine
from bench.procs import Agent, AgentFailed, end_owners, set_environ, spawn_owners
from exitwatch import on_death
from exitwatch.contract import ENV_HOOK_DIR
from exitwatch.kinds.spool.entry import ensure_spool

DEADLINE = 10.0  # seconds for one stamp to appear; past it the trial counts as missed
STAMP = 'echo "$EPOCHREALTIME" > "$0"'


def run(engine: Engine, source: str, trials: int) -> dict:
    """SIGKILL-to-hook latencies of `trials` owners, each with one hook, and as many plain
    starts of the same command."""
    work = tempfile.mkdtemp(prefix="exitwatch-bench-hooks-")
    os.chmod(work, 0o755)
    spool, empty = os.path.join(work, "hooks"), os.path.join(work, "empty")
    ensure_spool(spool)
    os.mkdir(empty)  # the only workdir root: nothing to find there
    owners = spawn_owners(trials)
    result: dict = {"source": source, "trials": trials}
    restore = set_environ({ENV_HOOK_DIR: spool})
    try:
        # Registered before the agent starts: its start-up listing holds every hook, so no
        # trial measures the discovery of a hook that was just written.
        for i, o in enumerate(owners):
            on_death(["bash", "-c", STAMP, f"{work}/hook-{i}"], pid=o.proc.pid, timeout=10)
        agent = Agent(source, engine.host, [empty], hook_dir=spool)
        hook, plain, missed = [], [], 0
        try:
            agent.start()
            result["ready_s"] = round(agent.wait_ready(), 3)
            for i, o in enumerate(owners):
                stamp = f"{work}/plain-{i}"
                floor_at = time.time()
                proc = subprocess.Popen(["bash", "-c", STAMP, stamp])
                floor_started = stamped(stamp)
                proc.wait()

                stamp = f"{work}/hook-{i}"
                at = time.time()
                o.kill()
                started = stamped(stamp)
                if started is None:
                    missed += 1
                    continue
                # Kept in pairs: each hook trial against the plain start run next to it.
                if floor_started is not None:
                    plain.append((floor_started - floor_at) * 1000)
                    hook.append((started - at) * 1000)
        except AgentFailed as err:
            return result | {"unavailable": str(err)}
        finally:
            agent.stop()
    finally:
        restore()
        end_owners(owners)
        shutil.rmtree(work, ignore_errors=True)
    return result | {
        "missed": missed,
        "hook_ms": stats.summary(hook),
        "plain_ms": stats.summary(plain),
        "overhead_ms": stats.paired(hook, plain),
    }


def stamped(path: str) -> float | None:
    """The wall-clock time the command wrote to `path`, once it has; None past DEADLINE."""
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        with contextlib.suppress(FileNotFoundError):
            with open(path) as f:
                text = f.read()
            if text.endswith("\n"):
                return float(text)
        time.sleep(0.0005)
    return None
