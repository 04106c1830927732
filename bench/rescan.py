"""The process kind's rescan cost, in process: `python3 -m bench.rescan [EXTRA]` lists /proc
as the agent's watching thread does, with EXTRA (default 3000) idle `sleep` processes
started for the purpose beside the host's own, and prints the wall and CPU time per rescan
and per process. The sleeps are one session's, SIGKILLed as a group at the end.

Not a section of `make bench`: it measures the kind's code alone, with no agent around it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from exitwatch.resources.processes import _Seen

ROUNDS = 20


def _measure(rounds: int = ROUNDS) -> dict:
    seen = _Seen()
    first = time.process_time()
    seen.rescan()  # the first one reads every environment; the rest are the idle cost
    first = time.process_time() - first
    wall, cpu = time.monotonic(), time.process_time()
    for _ in range(rounds):
        seen.rescan()
    wall, cpu = (time.monotonic() - wall) / rounds, (time.process_time() - cpu) / rounds
    n = len(seen.procs)
    return {
        "processes": n,
        "first_cpu_ms": round(first * 1e3, 1),
        "wall_ms": round(wall * 1e3, 2),
        "cpu_ms": round(cpu * 1e3, 2),
        "cpu_us_per_process": round(cpu / n * 1e6, 1),
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
