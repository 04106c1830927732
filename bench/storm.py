"""2. Exit storm: one C fork loop per core for the whole window while owners holding a
container and a workdir are SIGKILLed at random moments. Every reader of the storm (the
agent, the C floor reader, forkstat) is measured on the same storm, by /proc CPU time: each
storm has readers of its own."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import time

from bench import stats
from bench.engine import Destroyed, Engine
from bench.gone import Gone
from bench.procs import (
    Agent,
    AgentFailed,
    CpuMeter,
    end_owners,
    marked_dirs,
    spawn_owners,
    thread_of,
)

LATE_MS = 2000.0
DEADLINE = 10.0  # seconds after the storm for the last reaps to be seen
BPF_STATS = "/proc/sys/kernel/bpf_stats_enabled"
PER_100K = 100_000


def run(
    engine: Engine,
    variant: str,
    seconds: float,
    n_owners: int,
    root: str,
    bindir: str,
    seed: int,
) -> dict:
    """`variant`: netlink (exit-only filter), netlink-nofilter, or ebpf. Each storm has its
    own floor reader and forkstat, so every ratio compares readers of the same storm."""
    source = "netlink" if variant.startswith("netlink") else variant
    owners = spawn_owners(n_owners)
    made = engine.create_for([o.owner for o in owners], 1)
    dirs = marked_dirs(root, owners, f"storm-{variant}")
    destroyed, gone = Destroyed(engine), Gone()
    for d in dirs:
        gone.add(d)
    exit_filter = variant != "netlink-nofilter"
    agent = Agent(source, engine.host, [root], exit_filter=exit_filter)
    readers: dict[str, subprocess.Popen[str]] = {}
    result: dict = {
        "variant": variant,
        "seconds": seconds,
        "owners": n_owners,
        "exit_filter": exit_filter if source == "netlink" else None,
    }
    old_bpf_stats = _bpf_stats_enable() if source == "ebpf" else None
    try:
        agent.start()
        agent.wait_ready()
        result["source_line"] = next(
            (x.split("exit source ", 1)[1] for x in agent.lines if "exit source " in x), None
        )
        readers["floor"] = subprocess.Popen(
            [os.path.join(bindir, "cnfloor")], stdout=subprocess.PIPE, text=True
        )
        if shutil.which("forkstat"):
            readers["forkstat"] = subprocess.Popen(
                ["forkstat", "-e", "exit"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
        time.sleep(0.5)  # let the readers subscribe before the storm starts
        meters = {"agent": CpuMeter(agent.pid)} | {k: CpuMeter(p.pid) for k, p in readers.items()}
        # The source's reader thread alone: the agent's total also pays for the removals.
        reader = thread_of(agent.pid, f"ew-{source}")
        if reader is not None:
            meters["reader"] = CpuMeter(reader)
        bpf_before = _bpf_prog_stats(agent.pid) if source == "ebpf" else None
        counted_before = agent.counters()
        for m in meters.values():
            m.begin()
        kills = _storm(owners, seconds, bindir, random.Random(seed), result)
        cpu = {k: m.end() for k, m in meters.items()}
        if bpf_before is not None:
            result["bpf"] = _bpf_delta(bpf_before, _bpf_prog_stats(agent.pid))
        reaped = destroyed.wait(made_ids := [made[o.owner][0] for o in owners], DEADLINE)
        reaped &= gone.wait(dirs, DEADLINE)
        # The source's own counters: a log line about lost hints is rate-limited.
        counted = agent.counters()
        for key in ("events_lost", "resyncs"):
            result[key] = counted[key] - counted_before[key]
    except AgentFailed as err:
        return result | {"unavailable": str(err)}
    finally:
        if old_bpf_stats is not None:
            _write(BPF_STATS, old_bpf_stats)
        floor_out = _stop_readers(readers)
        agent.stop()
        destroyed.close()
        gone.close()
        end_owners(owners)
        engine.clean()
    lat_c = [_ms(destroyed.when(c), k) for c, k in zip(made_ids, kills, strict=True)]
    lat_w = [_ms(gone.when(d), k) for d, k in zip(dirs, kills, strict=True)]
    both = [max(a, b) for a, b in zip(lat_c, lat_w, strict=True)]
    exits = result["exits"]
    result |= {
        "all_reaped": reaped,
        "missed": sum(x is None for x in both),
        "late": sum(x is not None and x > LATE_MS for x in both),
        "container_ms": stats.summary([x for x in lat_c if x is not None]),
        "workdir_ms": stats.summary([x for x in lat_w if x is not None]),
        "cpu_s": {k: round(v, 3) for k, v in cpu.items()},
        "cpu_s_per_100k_exits": {k: round(v / exits * PER_100K, 3) for k, v in cpu.items()},
        "exited_early": [k for k, m in meters.items() if m.exited_early],
        "floor_reader": floor_out,
    }
    per = result["cpu_s_per_100k_exits"]
    result["agent_vs_floor"] = stats.ratio(per["agent"], per.get("floor"))
    result["reader_vs_floor"] = stats.ratio(per.get("reader"), per.get("floor"))
    result["forkstat_vs_agent"] = stats.ratio(per.get("forkstat"), per["agent"])
    return result


def _storm(
    owners: list, seconds: float, bindir: str, rng: random.Random, result: dict
) -> list[float]:
    """Run the fork loops; kill each owner at its random moment. The kill times, in order."""
    moments = sorted(rng.uniform(0.05, 0.95) * seconds for _ in owners)
    loops = [
        subprocess.Popen(
            [os.path.join(bindir, "forkloop"), str(seconds)], stdout=subprocess.PIPE, text=True
        )
        for _ in range(os.cpu_count() or 1)
    ]
    start = time.monotonic()
    kills = []
    try:
        for owner, moment in zip(owners, moments, strict=True):
            time.sleep(max(0.0, start + moment - time.monotonic()))
            kills.append(owner.kill())
        counts = [int(p.communicate()[0]) for p in loops]
    finally:
        for p in loops:
            if p.poll() is None:
                p.kill()
                p.wait()
    wall = time.monotonic() - start
    result["loops"] = len(loops)
    result["exits"] = sum(counts) + len(owners)
    result["exits_per_s"] = round(result["exits"] / wall)
    return kills


def _stop_readers(readers: dict[str, subprocess.Popen[str]]) -> dict | None:
    floor = None
    for name, proc in readers.items():
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
        if name == "floor" and out:
            words = out.split()
            floor = {"events": int(words[1]), "enobufs": int(words[3])}
    return floor


def _ms(end: float | None, start: float) -> float | None:
    return None if end is None else (end - start) * 1000


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _bpf_stats_enable() -> str:
    """Turn on the kernel's per-program run time accounting; the old value, to restore."""
    with open(BPF_STATS) as f:
        old = f.read().strip()
    _write(BPF_STATS, "1")
    return old


def _bpf_prog_stats(pid: int) -> dict[str, int]:
    """run_time_ns and run_cnt summed over the BPF programs whose fds process `pid` holds,
    from /proc/PID/fdinfo: the kernel's own accounting, with no tool between."""
    total = {"run_time_ns": 0, "run_cnt": 0}
    seen = set()
    for fd in os.listdir(f"/proc/{pid}/fdinfo"):
        try:
            with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                info = dict(line.split(":", 1) for line in f if ":" in line)
        except FileNotFoundError:
            continue  # closed meanwhile
        prog = info.get("prog_id", "").strip()
        if prog and prog not in seen:
            seen.add(prog)
            for k in total:
                total[k] += int(info.get(k, "0").strip())
    return total


def _bpf_delta(before: dict[str, int], after: dict[str, int]) -> dict:
    ns = after["run_time_ns"] - before["run_time_ns"]
    cnt = after["run_cnt"] - before["run_cnt"]
    return {"run_cnt": cnt, "run_time_ns": ns, "ns_per_run": round(ns / cnt, 1) if cnt else None}
