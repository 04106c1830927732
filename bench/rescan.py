"""The process kind's rescan cost, in process: `python3 -m bench.rescan [EXTRA]` lists /proc
as the agent's watching thread does, with EXTRA (default 3000) idle `sleep` processes
started for the purpose beside the host's own, and prints the CPU time of a full rescan
(every process's identity read), of a partial one (new pids only) and of their mean as the
watching thread mixes them, per rescan and per process. The sleeps are one session's,
SIGKILLed as a group at the end.

Not a section of `make bench`: it measures the kind's code alone, with no agent around it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from exitwatch.kinds.processes.kind import KIND
from exitwatch.kinds.processes.table import FULL_EVERY, Table

ROUNDS = 20


def _measure(rounds: int = ROUNDS) -> dict:
    seen = Table(KIND)
    first = time.process_time()
    seen.rescan()  # the first one reads every environment; the rest are the idle cost
    first = time.process_time() - first
    cost = {}
    for name, full in (("full", True), ("partial", False)):
        cpu = time.process_time()
        for _ in range(rounds):
            seen.rescan(full=full)
        cost[name] = (time.process_time() - cpu) / rounds
    # As the watching thread mixes them: one full rescan in FULL_EVERY.
    mean = (cost["full"] + (FULL_EVERY - 1) * cost["partial"]) / FULL_EVERY
    n = len(seen.procs)
    return {
        "processes": n,
        "first_cpu_ms": round(first * 1e3, 1),
        "full_cpu_ms": round(cost["full"] * 1e3, 2),
        "partial_cpu_ms": round(cost["partial"] * 1e3, 2),
        "mean_cpu_ms": round(mean * 1e3, 2),
        "cpu_us_per_process": round(mean / n * 1e6, 2),
    }


def main(extra: int) -> None:
    before = _measure()
    spawner = subprocess.Popen(
        ["sh", "-c", f"i=0; while [ $i -lt {extra} ]; do sleep 100000 & i=$((i+1)); done; wait"],
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with open(f"/proc/{spawner.pid}/task/{spawner.pid}/children") as f:
                if len(f.read().split()) >= extra:
                    break
            time.sleep(0.1)
        time.sleep(1)  # the last sleeps exec
        with_extra = _measure()
    finally:
        os.killpg(spawner.pid, signal.SIGKILL)
        spawner.wait()
    print(json.dumps({"extra": extra, "before": before, "with_extra": with_extra}))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3000)
