"""1. Reap latency: owner SIGKILL -> its container is gone, and -> its workdir is gone, by
the benchmark's clock. The floor, timed in the same loop, is the engine removing the same
kind of container on request; the overhead is taken trial by trial against the floor trial
run just before."""

from __future__ import annotations

import random
import subprocess
import time

from bench import stats
from bench.engine import Engine
from bench.gone import Gone
from bench.procs import Agent, AgentFailed, end_owners, marked_dirs, spawn_owners

DEADLINE = 10.0  # seconds for one removal to be seen; past it the trial counts as missed


def run(
    engine: Engine,
    source: str,
    trials: int,
    root: str,
    poll_interval: float,
    find_engines: bool | None = None,
    noise: bool = False,
) -> dict:
    """Latencies of one source over `trials` owners, each holding one running container and
    one workdir; every trial also times the two floors. `find_engines`: the agent's
    --find-engines, or None for the config's default. `noise`: each trial also removes one
    more floor container by the API just before the API floor, and the per-trial difference
    of the two (`floor_noise_ms`) is what pairing two neighbouring removals that are the
    same gives: the noise under the overhead."""
    owners = spawn_owners(trials)
    made = engine.create_for([o.owner for o in owners], 1, start=True)
    floor_api = engine.create(trials, start=True)
    floor_cli = engine.create(trials, start=True)
    floor_before = engine.create(trials, start=True) if noise else []
    dirs = marked_dirs(root, owners, source)
    destroyed, gone = engine.destroyed(), Gone()
    agent = Agent(
        source,
        engine.host,
        [root],
        poll_interval if source == "poll" else None,
        find_engines=find_engines,
    )
    result: dict = {"source": source, "trials": trials}
    rng = random.Random(trials)
    try:
        agent.start()
        result["ready_s"] = round(agent.wait_ready(), 3)
        result["watching"] = agent.watching()
        lat_c, lat_w, api, cli, before, missed = [], [], [], [], [], 0

        def api_floor(cid: str) -> float:
            at = time.monotonic()
            engine.api.remove_container(cid, force=True, v=True)
            destroyed.wait([cid], DEADLINE)
            return _ms(destroyed.when(cid), at)

        paired_floor = []  # the API floor of each trial that was not missed
        for i, o in enumerate(owners):
            at = time.monotonic()
            subprocess.run(
                ["docker", "rm", "-f", floor_cli[i]],
                env=engine.env(),
                stdout=subprocess.DEVNULL,
                check=True,
            )
            destroyed.wait([floor_cli[i]], DEADLINE)
            cli.append(_ms(destroyed.when(floor_cli[i]), at))

            if noise:
                before.append(api_floor(floor_before[i]))
            # The API floor runs right before ours: the pair sees the same engine.
            api.append(api_floor(floor_api[i]))

            gone.add(dirs[i])
            cid = made[o.owner][0]
            if source == "poll":
                # Each trial ends just after a poll tick reaped its owner; without a random
                # pause every kill would land at the same phase of the interval.
                time.sleep(rng.uniform(0, poll_interval))
            at = o.kill()
            ok = destroyed.wait([cid], DEADLINE) & gone.wait([dirs[i]], DEADLINE)
            if not ok:
                missed += 1
                continue
            lat_c.append(_ms(destroyed.when(cid), at))
            lat_w.append(_ms(gone.when(dirs[i]), at))
            paired_floor.append(api[-1])
    except AgentFailed as err:
        return result | {"unavailable": str(err)}
    finally:
        agent.stop()
        destroyed.close()
        gone.close()
        end_owners(owners)
        engine.clean()
    if noise:
        result["floor_noise_ms"] = stats.paired(api, before)
    return result | {
        "poll_interval_s": poll_interval if source == "poll" else None,
        "missed": missed,
        "container_ms": stats.summary(lat_c),
        "workdir_ms": stats.summary(lat_w),
        "floor_api_ms": stats.summary(api),
        "floor_cli_ms": stats.summary(cli),
        "overhead_ms": stats.paired(lat_c, paired_floor),
        "agent_log_latency_ms": _logged(agent.lines),
    }


def _ms(end: float | None, start: float) -> float:
    assert end is not None
    return (end - start) * 1000


def _logged(lines: list[str]) -> dict:
    """The agent's own latency_ms figures for containers, beside ours (not the figure)."""
    values = [
        float(x.split("latency_ms=")[1].split()[0])
        for x in lines
        if "reaped container" in x and "latency_ms=" in x
    ]
    return stats.summary(values)
