"""4. Scale: the agent's start-up reconcile (time to its "ready:" line) against listing the
same containers or finding the same markers, and its periodic reconcile of those markers;
and bulk reaps (one owner's containers, and as many between several owners dying at once)
against `docker rm -f` of as many."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import threading
import time

from bench import stats
from bench.engine import Destroyed, Engine
from bench.procs import Agent, Runner, end_owners, spawn_owners
from exitwatch.contract import LABEL_OWNER, MARKER

RUNS = 3  # alternated runs of ours and the baseline; the median of each is reported
DEADLINE = 300.0
PERIODIC = 2  # periodic reconciles timed per run of the agent
# The agent's log: the discovery thread has walked everything, and follows it with inotify
# or, failing that (too few inotify watches), with rescans.
WALKED = ("following workdirs under ", "workdir discovery falls back to rescans")
RECONCILED = "reconcile: listed "  # "... N resources in S s"


def _timed(argv: list[str], env: dict[str, str] | None = None) -> float:
    at = time.monotonic()
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, check=True)
    return time.monotonic() - at


def _ready(engine: Engine, roots: list[str]) -> tuple[float, int]:
    with Agent("auto", engine.host, roots) as agent:
        return agent.wait_ready(DEADLINE), agent.watching()


def _compare(ours: list[float], base: list[float]) -> dict:
    return {
        "ours_s": [round(x, 3) for x in ours],
        "baseline_s": [round(x, 3) for x in base],
        "ours_median_s": round(stats.median(ours), 3),
        "baseline_median_s": round(stats.median(base), 3),
        "ratio": stats.ratio(stats.median(ours), stats.median(base)),
    }


def reconcile(
    engine: Engine, owners: list[Runner], total: int, empty_root: str, runs: int = RUNS
) -> dict:
    """Tops the engine up to `total` labelled containers of the live `owners`, then times
    the agent's start-up against `docker ps -a --filter label=exitwatch.owner`."""
    missing = total - engine.count()
    if missing > 0:
        per = -(-missing // len(owners))
        made = engine.create_for([o.owner for o in owners], per)
        extra = [c for ids in made.values() for c in ids][missing:]
        engine.remove(extra)
    ours, base, watching = [], [], 0
    ps = ["docker", "ps", "-a", "--filter", f"label={LABEL_OWNER}"]
    for _ in range(runs):
        took, watching = _ready(engine, [empty_root])
        ours.append(took)
        base.append(_timed(ps, engine.env()))
    return {"containers": engine.count(), "watching": watching} | _compare(ours, base)


def startup(engine: Engine, empty_root: str, runs: int = RUNS) -> dict:
    """The agent's time to "ready:" with nothing to list: the fixed cost in the others."""
    return {"ours_s": [round(_ready(engine, [empty_root])[0], 3) for _ in range(runs)]}


def bulk(
    engine: Engine,
    n: int,
    empty_root: str,
    owners: int = 1,
    concurrency: int | None = 16,
    runs: int = RUNS,
) -> dict:
    """`runs` alternated trials: one live owner with `n` containers, and `owners` more with
    `n` between them; the baseline removes the one's with `docker rm -f $(docker ps -aq
    --filter ...)`, the agent (with `engine_concurrency` = `concurrency`) reaps the others'
    when they all die at once. Both are timed to the last destroy event; the medians are
    compared (one trial each was at the mercy of whatever else the host did in those
    seconds). The agent's connections to the engine at once are sampled meanwhile."""
    ours, base, peaks = [], [], []
    for _ in range(runs):
        ours_s, base_s, peak = _bulk_once(engine, n, empty_root, owners, concurrency)
        ours.append(ours_s)
        base.append(base_s)
        peaks.append(peak)
    ours_ok = [x for x in ours if x is not None]
    base_ok = [x for x in base if x is not None]
    ours_s = stats.median(ours_ok) if len(ours_ok) == runs else None
    base_s = stats.median(base_ok) if len(base_ok) == runs else None
    out: dict = {"containers": n, "owners": owners, "engine_concurrency": concurrency}
    out |= {"ours_s": _r(ours_s), "baseline_s": _r(base_s), "peak_connections": max(peaks)}
    out["ours_runs_s"] = [_r(x) for x in ours]
    out["baseline_runs_s"] = [_r(x) for x in base]
    out["ours_per_s"] = round(n / ours_s, 1) if ours_s else None
    out["baseline_per_s"] = round(n / base_s, 1) if base_s else None
    out["throughput_ratio"] = stats.ratio(out["ours_per_s"], out["baseline_per_s"])
    return out


def _bulk_once(
    engine: Engine, n: int, empty_root: str, dying: int, concurrency: int | None
) -> tuple[float | None, float | None, int]:
    """One trial: (agent's seconds, baseline's seconds), None for one that missed DEADLINE,
    and the most connections the agent had open to the engine, beyond those before."""
    ours, (base_owner,) = spawn_owners(dying), spawn_owners(1)
    try:
        made = engine.create_for([o.owner for o in ours], n // dying)
        ours_ids = [c for ids in made.values() for c in ids]
        base_ids = engine.create_for([base_owner.owner], n)[base_owner.owner]
        destroyed = Destroyed(engine)
        try:
            with Agent("auto", engine.host, [empty_root], engine_concurrency=concurrency) as agent:
                agent.wait_ready(DEADLINE)
                label = f"label={LABEL_OWNER}={base_owner.owner}"
                at = time.monotonic()
                subprocess.run(
                    ["bash", "-c", f'docker rm -f $(docker ps -aq --filter "{label}")'],
                    env=engine.env(),
                    stdout=subprocess.DEVNULL,
                    check=True,
                )
                base_ok = destroyed.wait(base_ids, DEADLINE)
                base_s = max(destroyed.seen[c] for c in base_ids) - at if base_ok else None
                peak = _Peak(agent.pid)
                at = min(o.kill() for o in ours)
                ours_ok = destroyed.wait(ours_ids, DEADLINE)
                ours_s = max(destroyed.seen[c] for c in ours_ids) - at if ours_ok else None
                most = peak.end()
        finally:
            destroyed.close()
    finally:
        end_owners([*ours, base_owner])
        engine.clean()
    return ours_s, base_s, most


def _sockets(pid: int) -> int:
    n = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(FileNotFoundError):  # closed since the listing
            n += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
    return n


class _Peak:
    """The most sockets `pid` holds beyond those it held when this began, every 5 ms: its
    connections to the engine during a reap (a DELETE's is closed when it is answered; the
    few keep-alive ones of the listings stay open)."""

    def __init__(self, pid: int) -> None:
        self._pid, self._base, self._most = pid, _sockets(pid), 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self._most = max(self._most, _sockets(self._pid) - self._base)

    def end(self) -> int:
        self._stop.set()
        self._thread.join()
        return self._most


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def _periodic(agent: Agent) -> list[float]:
    """The time PERIODIC periodic reconciles took that began once the watcher had walked
    everything (from then on a reconcile reads only the markers that changed), from the
    agent's log: asking its status would list every workdir, and load what is measured."""
    deadline = time.monotonic() + DEADLINE
    watched, took = None, []
    seen = 0
    while len(took) < PERIODIC:
        if time.monotonic() > deadline or agent.proc.poll() is not None:
            raise RuntimeError("the agent's periodic reconciles did not come")
        while seen < len(agent.lines):
            line, at = agent.lines[seen], agent.arrived[seen]
            seen += 1
            if watched is None and any(w in line for w in WALKED):
                watched = at
            elif watched is not None and RECONCILED in line:
                s = float(line.split(RECONCILED, 1)[1].split()[3])
                if at - s > watched:
                    took.append(s)
        time.sleep(0.1)
    return took[:PERIODIC]


def workdirs(
    engine: Engine,
    owner: Runner,
    n: int,
    root: str,
    interval: float,
    depth: int = 3,
    runs: int = RUNS,
) -> dict:
    """`n` marked dirs of one live owner, 1,000 per parent (ROOT/dI/wJ/MARKER); the
    agent's time to "ready:", and the time its periodic reconciles (every `interval` s;
    the first comes after ready, during the watcher's walk, and is not timed) take,
    against `find ROOT -maxdepth 3 -name MARKER`. The engine is empty: the reconciles'
    other listings take milliseconds."""
    body = json.dumps({"owner": str(owner.owner)}).encode()
    for i in range(n):
        parent = os.path.join(root, f"d{i // 1000}")
        if i % 1000 == 0:
            os.mkdir(parent)
        path = os.path.join(parent, f"w{i}")
        os.mkdir(path)
        fd = os.open(os.path.join(path, MARKER), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, body)
        os.close(fd)
    ours, periodic, base, watching = [], [], [], 0
    find = ["find", root, "-maxdepth", str(depth), "-name", MARKER]
    for _ in range(runs):
        with Agent("auto", engine.host, [root], reconcile_interval=interval) as agent:
            ours.append(agent.wait_ready(DEADLINE))
            watching = agent.watching()
            periodic += _periodic(agent)
        base.append(_timed(find))
    return (
        {"dirs": n, "watching": watching}
        | _compare(ours, base)
        | {
            "periodic_s": [round(x, 3) for x in periodic],
            "periodic_median_s": round(stats.median(periodic), 3),
            "periodic_ratio": stats.ratio(stats.median(periodic), stats.median(base)),
        }
    )
