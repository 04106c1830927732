"""8. Several engines: the reap latency on a private rootful podman, over that engine's own
forced removal (as section 1 does on Docker); and the idle cost of one agent following N
private podmans against one following one of them, the two taking turns within each trial."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from bench import idle, latency, stats
from bench.engine import Engine
from bench.procs import Agent, Runner, end_owners, spawn_owners

SOURCE = "netlink"  # the source every test host has; section 1 compares the sources


@contextmanager
def podmans(base: str, count: int) -> Iterator[list[Engine]]:
    """`count` private rootful podmans, in BASE-p0, BASE-p1, ...; purged afterwards, with
    their network namespaces and what their containers mounted (a stopped podman's
    containers outlive it)."""
    engines: list[Engine] = []
    try:
        for i in range(count):
            engines.append(Engine(f"{base}-p{i}", "podman"))
        yield engines
    finally:
        for e in engines:
            e.close(purge=True)


def run(
    base: str,
    work: str,
    trials: int,
    count: int,
    owners: int,
    per_owner: int,
    seconds: float,
    runs: int,
) -> dict:
    """`base`: the prefix of the podmans' directories (kept short: socket paths live under
    them); `work`: an empty directory of this run's."""
    roots = {}
    for name in ("latency", "empty"):
        roots[name] = os.path.join(work, name)
        os.makedirs(roots[name])
    with podmans(base, count) as engines:
        first = engines[0]
        out: dict = {"podman": first.version, "engines": count, "source": SOURCE}
        # The agent follows the podman it is given and nothing else: a user's rootless
        # engine that another program started on this host is not part of the figure.
        out["rootful_podman"] = latency.run(
            first, SOURCE, trials, roots["latency"], 0.0, find_engines=False
        )
        living = spawn_owners(owners)
        try:
            out["idle"] = _idle(engines, living, per_owner, seconds, runs, roots["empty"])
        finally:
            end_owners(living)
            for e in engines:
                e.clean()
    return out


def _idle(
    engines: list[Engine],
    owners: list[Runner],
    per_owner: int,
    seconds: float,
    runs: int,
    root: str,
) -> dict:
    """Every engine holds `per_owner` created containers of each live owner. Each trial runs
    the agent following all the engines and the one following the first, in turns (who goes
    first alternates), and takes the ratio of the two."""
    for e in engines:
        e.create_for([o.owner for o in owners], per_owner)
    hosts = tuple(e.host for e in engines)
    follows = {"all": hosts, "one": hosts[:1]}
    figures: dict[str, list[dict]] = {"all": [], "one": []}
    for i in range(runs):
        for name in ("all", "one") if i % 2 == 0 else ("one", "all"):
            agent = Agent("auto", hosts[0], [root], engines=follows[name], find_engines=False)
            with agent:
                figures[name].append(idle.measure(agent, seconds))
    out: dict = {
        "owners": len(owners),
        "containers_per_engine": len(owners) * per_owner,
        "runs": runs,
        **{name: figures[name] for name in ("all", "one")},
    }
    for key in ("cpu_pct", "rss_mb"):
        ratios = [
            stats.ratio(a[key], b[key]) for a, b in zip(figures["all"], figures["one"], strict=True)
        ]
        out[f"{key}_ratios"] = ratios
        # A trial whose one-engine agent used no measurable CPU (under a clock tick) has
        # no ratio; the median is of the others, None when there are none.
        measured = [r for r in ratios if r is not None]
        out[f"{key}_ratio"] = stats.median(measured) if measured else None
    return out
