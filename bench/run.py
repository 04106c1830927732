"""`make bench`: run the sections, print the table, write bench/results.json, update
docs/benchmarks.md. Sizes come from BENCH_* environment variables or flags; --smoke shrinks
them all so the whole run takes well under a minute."""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import docker
import psutil

from bench import (
    adopt,
    engines,
    hooks,
    idle,
    latency,
    page,
    report,
    scale,
    storm,
    watchdog,
    wrapper,
)
from bench.engine import Engine
from bench.procs import end_owners, spawn_owners

HERE = Path(__file__).resolve().parent
SECTIONS = (
    *("latency", "storm", "idle", "scale", "hooks", "watchdog", "wrapper", "adopt", "engines"),
)


@dataclass(frozen=True)
class Sizes:
    trials: int = 100
    """Reap-latency trials per source."""
    poll_interval: float = 0.5
    """The poll source's interval in the latency section, seconds."""
    storm_seconds: float = 30.0
    """Length of each exit storm."""
    storm_owners: int = 100
    """Owners killed at random moments during each storm."""
    idle_owners: int = 1000
    """Live owners in the idle section."""
    idle_per_owner: int = 5
    """Created containers per idle owner."""
    idle_seconds: float = 60.0
    """How long the idle agent's CPU is measured."""
    reconcile_containers: int = 10_000
    """Labelled containers for the start-up reconcile."""
    bulk_containers: int = 1000
    """Containers of the one owner reaped in bulk (and of the baseline's owner)."""
    bulk_owners: int = 10
    """Owners dying at once in the second bulk reap, `bulk_containers` between them."""
    bulk_concurrency: int = 16
    """The agent's `engine_concurrency` in the bulk reaps."""
    workdirs: int = 100_000
    """Marked dirs for the workdir reconcile."""
    reconcile_interval: float = 5.0
    """Seconds between the periodic reconciles timed over those dirs."""
    watchdog_trials: int = 30
    """Owners ended by their watchdog (a second each), each paired with one SIGKILLed."""
    wrapper_trials: int = 100
    """create+start pairs through `exitwatch run`'s socket and directly."""
    wrapper_stream_mb: int = 256
    """Size of the stream read through the run's socket and directly, MiB."""
    wrapper_clients: int = 64
    """Clients at once through the run's socket, each creating, exec'ing in and removing."""
    adopt_trials: int = 100
    """create+start pairs through `exitwatch adopt`'s socket and directly."""
    adopt_stream_mb: int = 256
    """Size of the stream read through the adopt socket and directly, MiB."""
    adopt_cp_mb: int = 1024
    """Size of the `docker cp` out of a container through the adopt socket, MiB."""
    adopt_list_requests: int = 50
    """Listings per client and round, through the adopt socket and directly."""
    scale_runs: int = 3
    """Alternated runs of the agent and the baseline in each scale figure."""
    engines_trials: int = 100
    """Reap-latency trials on the private rootful podman."""
    engines_count: int = 5
    """Private rootful podmans followed at once in the idle comparison (against one)."""
    engines_owners: int = 50
    """Live owners in the idle comparison, with containers on every engine."""
    engines_per_owner: int = 2
    """Created containers per owner on each engine."""
    engines_idle_seconds: float = 60.0
    """How long each agent's CPU is measured in each trial of the idle comparison."""
    engines_idle_runs: int = 3
    """Trials of the idle comparison, each running both agents in turn."""


SMOKE = Sizes(
    trials=3,
    poll_interval=0.2,
    storm_seconds=2.0,
    storm_owners=3,
    idle_owners=5,
    idle_per_owner=2,
    idle_seconds=2.0,
    reconcile_containers=20,
    bulk_containers=10,
    bulk_owners=2,
    workdirs=200,
    reconcile_interval=1.0,
    watchdog_trials=3,
    wrapper_trials=3,
    wrapper_stream_mb=16,
    wrapper_clients=8,
    adopt_trials=3,
    adopt_stream_mb=16,
    adopt_cp_mb=16,
    adopt_list_requests=5,
    scale_runs=1,
    engines_trials=3,
    engines_count=2,
    engines_owners=3,
    engines_per_owner=1,
    engines_idle_seconds=1.0,
    engines_idle_runs=1,
)


def _sizes(args: argparse.Namespace) -> Sizes:
    base = SMOKE if args.smoke else Sizes()
    values = {}
    for f in fields(Sizes):
        env = os.environ.get(f"BENCH_{f.name.upper()}")
        values[f.name] = type(getattr(base, f.name))(env) if env else getattr(base, f.name)
    return Sizes(**values)


def _machine(engine: Engine) -> dict:
    def first(cmd: list[str]) -> str:
        with contextlib.suppress(OSError, subprocess.CalledProcessError):
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            return out.strip().splitlines()[0]
        return "unknown"

    model = "unknown"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "kernel": platform.release(),
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "docker_py": docker.__version__,
        "psutil": psutil.__version__,
        "dockerd": engine.version,
        "docker_cli": first(["docker", "--version"]),
        "forkstat": first(["forkstat", "-h"]) if shutil.which("forkstat") else None,
        "gcc": first(["gcc", "--version"]),
    }


def _cpu_s() -> float:
    own, waited = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime + waited.ru_utime + waited.ru_stime


def _fresh(path: str) -> str:
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


def run(args: argparse.Namespace, partial: str | None = None) -> dict:
    """All the sections asked for; after each, the results so far go to `partial`."""
    sizes = _sizes(args)
    only = set(args.only.split(",")) if args.only else set(SECTIONS)
    work = tempfile.mkdtemp(prefix="exitwatch-bench-")
    engine = Engine(args.engine_dir)
    results: dict = {
        "schema": 1,
        "smoke": args.smoke,
        "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": _machine(engine),
        "sizes": asdict(sizes),
        "sections": {},
        "costs": {},
    }
    begun, load = time.monotonic(), round(os.getloadavg()[0], 2)
    sections, costs = results["sections"], results["costs"]

    def section(name: str, measure: Callable[[], dict | list]) -> None:
        """One section; a failure is recorded in its place and the others still run. What
        it cost goes to results["costs"]: its seconds, and the CPU seconds of this process
        and of the children it waited for (agents, CLIs; not the engine's daemons)."""
        began, cpu = time.monotonic(), _cpu_s()
        try:
            sections[name] = measure()
        except Exception as err:
            sections[name] = {"error": f"{type(err).__name__}: {err}"}
        costs[name] = {
            "wall_s": round(time.monotonic() - began, 1),
            "cpu_s": round(_cpu_s() - cpu, 1),
        }
        print(json.dumps({name: sections[name]}), file=sys.stderr, flush=True)
        if partial:
            Path(partial).write_text(json.dumps(results, indent=2) + "\n")

    try:
        if "latency" in only:
            root = _fresh(os.path.join(work, "latency"))
            section(
                "latency",
                lambda: [
                    latency.run(engine, s, sizes.trials, root, sizes.poll_interval)
                    for s in ("netlink", "poll", "ebpf")
                ],
            )
        if "storm" in only:
            root = _fresh(os.path.join(work, "storm"))
            section(
                "storm",
                lambda: [
                    storm.run(
                        engine,
                        v,
                        sizes.storm_seconds,
                        sizes.storm_owners,
                        root,
                        args.bindir,
                        seed,
                    )
                    for seed, v in enumerate(("netlink", "netlink-nofilter", "ebpf"))
                ],
            )
        if "idle" in only or "scale" in only:
            owners = spawn_owners(sizes.idle_owners)
            try:
                empty = _fresh(os.path.join(work, "empty"))
                if "idle" in only:
                    section(
                        "idle",
                        lambda: idle.run(
                            engine, owners, sizes.idle_per_owner, sizes.idle_seconds, empty
                        ),
                    )
                if "scale" in only:
                    section("scale", lambda: _scale(engine, owners, sizes, work, empty))
            finally:
                end_owners(owners)
                engine.clean()
        if "hooks" in only:
            section("hooks", lambda: [hooks.run(engine, s, sizes.trials) for s in ("netlink",)])
        if "watchdog" in only:
            section("watchdog", lambda: watchdog.run(engine, "netlink", sizes.watchdog_trials))
        if "wrapper" in only:
            section(
                "wrapper",
                lambda: wrapper.run(
                    engine,
                    sizes.wrapper_trials,
                    sizes.wrapper_stream_mb << 20,
                    sizes.wrapper_clients,
                ),
            )
        if "adopt" in only:
            section(
                "adopt",
                lambda: adopt.run(
                    engine,
                    sizes.adopt_trials,
                    sizes.adopt_stream_mb << 20,
                    sizes.adopt_cp_mb << 20,
                    sizes.adopt_list_requests,
                ),
            )
        if "engines" in only:
            section(
                "engines",
                lambda: engines.run(
                    args.engine_dir,
                    _fresh(os.path.join(work, "engines")),
                    sizes.engines_trials,
                    sizes.engines_count,
                    sizes.engines_owners,
                    sizes.engines_per_owner,
                    sizes.engines_idle_seconds,
                    sizes.engines_idle_runs,
                ),
            )
    finally:
        engine.close()
        shutil.rmtree(work, ignore_errors=True)
    results["duration_s"] = round(time.monotonic() - begun, 1)
    # The 1-minute load average at the start and the end: other work on the machine.
    results["load"] = {"start": load, "end": round(os.getloadavg()[0], 2)}
    results["targets"] = report.targets(results)
    return results


def merged(old: dict, new: dict) -> dict:
    """`old` results with the sections of `new` in place of its own: a section rerun on
    its own, told apart by `merged` (when, how long, its sizes, the load meanwhile)."""
    if old.get("smoke") != new["smoke"]:
        raise SystemExit("--merge: smoke and full sizes do not mix")
    out = dict(old)
    out["sections"] = dict(old["sections"])
    out["costs"] = dict(old.get("costs", {}))
    out["sizes"] = dict(old["sizes"])
    out["merged"] = dict(old.get("merged", {}))
    for name, figures in new["sections"].items():
        out["sections"][name] = figures
        out["costs"][name] = new["costs"][name]
        sizes = {k: v for k, v in new["sizes"].items() if k.startswith(f"{name}_")}
        out["sizes"].update(sizes)
        out["merged"][name] = {
            "started": new["started"],
            "duration_s": new["duration_s"],
            "sizes": sizes,
            "load": new.get("load", "unknown"),
        }
    out["targets"] = report.targets(out)
    return out


def _scale(engine: Engine, owners: list, sizes: Sizes, work: str, empty: str) -> dict:
    runs = sizes.scale_runs
    out = {"reconcile": scale.reconcile(engine, owners, sizes.reconcile_containers, empty, runs)}
    engine.clean()
    out["startup_empty"] = scale.startup(engine, empty, runs)
    n, concurrency = sizes.bulk_containers, sizes.bulk_concurrency
    out["bulk"] = scale.bulk(engine, n, empty, concurrency=concurrency, runs=runs)
    out["bulk_many"] = scale.bulk(engine, n, empty, sizes.bulk_owners, concurrency, runs)
    root = _fresh(os.path.join(work, "workdirs"))
    out["workdirs"] = scale.workdirs(
        engine, owners[0], sizes.workdirs, root, sizes.reconcile_interval, runs=runs
    )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, for CI")
    parser.add_argument("--only", help=f"comma-separated subset of {','.join(SECTIONS)}")
    parser.add_argument("--results", default=str(HERE / "results.json"))
    parser.add_argument(
        "--merge",
        action="store_true",
        help="put the sections run (with --only) into the existing --results, keeping the "
        "others; each merged section's start, duration, sizes and load are kept under "
        "`merged`",
    )
    parser.add_argument(
        "--docs",
        default=str(HERE.parent / "docs" / "benchmarks.md"),
        help="the page to update; empty: leave it alone",
    )
    parser.add_argument(
        "--engine-dir",
        default="/tmp/exitwatch-bench",
        help="the private Docker engine's directory (kept short); the engines section's "
        "podmans are in DIR-p0, DIR-p1, ...",
    )
    parser.add_argument(
        "--bindir",
        default=str(HERE.parent / "build" / "bench"),
        help="where forkloop and cnfloor were built",
    )
    args = parser.parse_args(argv)
    for prog in ("forkloop", "cnfloor"):
        if not os.access(os.path.join(args.bindir, prog), os.X_OK):
            parser.error(f"{args.bindir}/{prog} is missing: build it with `make bench-bins`")
    if os.geteuid() != 0:
        parser.error("run as root: the agent, the engine and the proc connector need it")
    results = run(args, args.results + ".partial")
    os.unlink(args.results + ".partial")
    if args.merge:
        results = merged(json.loads(Path(args.results).read_text()), results)
    Path(args.results).write_text(json.dumps(results, indent=2) + "\n")
    print(report.table(results))
    if args.docs:
        page.update_docs(results, Path(args.docs), os.path.relpath(args.results, HERE.parent))
    return 0


if __name__ == "__main__":
    sys.exit(main())
