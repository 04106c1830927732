"""`make soak`: python -m soak, with the repository and tests/ on PYTHONPATH, as root."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from exitwatch.agent.audit import read as read_audit

from . import adopt, checks, hooks, plain, report, runs
from .actor import Actor, Ground, View
from .sampling import Sampler
from support.agentproc import Agent, agent_argv
from support.engine import ENGINE_SH
from support.users import attacker_user, temporary_user

# Each kind of owner, as a function of the soak's ground to its actors.
ACTORS: tuple[Callable[[Ground], list[Actor]], ...] = (
    plain.actors,
    runs.actors,
    hooks.actors,
    adopt.actors,
)
# Outside tests/conftest.py's engine directory, whose purge would take this one for dead.
ENGINE_DIR = Path("/tmp/exitwatch-soak-engine")
RECONCILE_INTERVAL = 60  # s: periodic reconciles laid over the events, ten in ten minutes


def _engine() -> str:
    ENGINE_DIR.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [str(ENGINE_SH), "start", str(ENGINE_DIR), str(ENGINE_DIR / "docker.sock")],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def _tempdir(prefix: str, mode: int) -> Path:
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))  # short: socket paths live here
    os.chmod(path, mode)
    return path


@dataclass
class Soaked:
    """What the end of a soak found."""

    ran: float = 0.0  # seconds the rounds ran
    load_after: tuple[float, ...] = ()
    violations: list[str] = field(default_factory=list)
    entries: list[dict] = field(default_factory=list)  # report.rows
    figures: list[dict] = field(default_factory=list)  # the actors' own
    owners: set[str] = field(default_factory=set)
    counters: dict = field(default_factory=dict)
    alive: bool = False


def _rounds(
    ground: Ground, agent: Agent, seconds: float, out: Soaked, actors: list[Actor], sampler: Sampler
) -> None:
    for actor in actors:
        actor.setup()
    began = time.monotonic()
    sampler.start(began)
    stop = threading.Event()
    threads = [threading.Thread(target=a.run, args=(stop,), name=f"soak-{a.name}") for a in actors]
    for t in threads:
        t.start()
    while time.monotonic() - began < seconds and agent.alive():
        time.sleep(1)
    stop.set()
    for t in threads:
        t.join()
    sampler.stop()
    out.ran, out.load_after = time.monotonic() - began, os.getloadavg()
    for actor in actors:
        actor.finish()
    api = ground.api()
    out.violations += checks.settle(actors, api, checks.REAP_DEADLINE)
    audit = list(read_audit(agent.flag("--audit-log")))
    for actor in actors:
        actor.check_live(View.now(api))
        out.violations += [*actor.wrong.values(), *actor.contract(audit), *actor.errors]
    out.entries = report.rows(actors)
    out.figures = [f for a in actors if (f := a.figures())]
    out.owners = {o.owner for a in actors for o in a.dead + a.steady + a.live}
    out.alive = agent.alive()
    out.counters = agent.status().get("counters", {}) if out.alive else {}
    out.violations += checks.counted(out.counters)
    shutil.copy(agent.flag("--audit-log"), ground.logs / "audit.jsonl")  # before the steady end
    shutil.copytree(ground.results, ground.logs / "hook-results")


def soak(ground: Ground, agent: Agent, seconds: float, out: Soaked) -> Sampler:
    """The rounds for `seconds`, then the end and its checks, into `out`."""
    mode = ground.spool.stat().st_mode & 0o7777
    if mode != 0o1733:
        out.violations.append(f"the agent made its spool {ground.spool} mode {mode:o}, not 1733")
    actors = [actor for make in ACTORS for actor in make(ground)]
    sampler = Sampler(agent.pid, actors)
    try:
        _rounds(ground, agent, seconds, out, actors, sampler)
    finally:
        for actor in actors:  # whatever happened: no process of the soak's outlives it
            actor.finish()
            actor.close()
    return sampler


def main() -> int:
    seconds = float(os.environ.get("SOAK_SECONDS", "600"))
    source = os.environ.get("SOAK_SOURCE", "auto")
    seed = os.environ.get("SOAK_SEED", "0")
    load_before = os.getloadavg()
    logs = _tempdir("exitwatch-soak-log-", 0o755)
    root = _tempdir("exitwatch-soak-", 0o700)
    shared = _tempdir("exitwatch-soak-hooks-", 0o755)  # the spool's parent, anyone may search
    (shared / "results").mkdir(mode=0o755)
    out = Soaked()
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, root, ignore_errors=True)
        stack.callback(shutil.rmtree, shared, ignore_errors=True)
        users = [attacker_user(), stack.enter_context(temporary_user("ewsoak-b"))]
        users.append(stack.enter_context(temporary_user("ewsoak-s")))
        host = _engine()
        stack.callback(subprocess.run, [str(ENGINE_SH), "purge", str(ENGINE_DIR)], check=False)
        spool, results = shared / "hooks", shared / "results"
        ground = Ground(host, root, spool, results, logs, users, random.Random(seed))
        stack.callback(lambda: [c.close() for c in ground.clients])
        extra = ("--hook-dir", str(spool), "--reconcile-interval", str(RECONCILE_INTERVAL))
        agent = Agent(
            agent_argv(source, host, root, extra=extra, leftovers=True), logs / "agent.log"
        )
        stack.callback(agent.stop)
        agent.wait_log("ready:")
        agent.wait_log("following hooks in")
        sampler = soak(ground, agent, seconds, out)
    latency, other = checks.latencies(str(logs / "audit.jsonl"), out.owners)
    warnings, errors = checks.agent_log((logs / "agent.log").read_text(errors="replace"))
    out.violations += errors + sampler.errors
    if not out.alive:
        out.violations.append(f"the agent died: {logs / 'agent.log'}")

    entries = out.entries
    print("\n".join(report.samples_table(sampler.samples)))
    print()
    print("\n".join(report.rows_table(entries)))
    print(
        report.summary(
            seconds=round(out.ran),
            source=source,
            seed=seed,
            load_average_before=[round(x, 2) for x in load_before],
            load_average_after=[round(x, 2) for x in out.load_after],
            owners=sum(e["made"] for e in entries),
            killed=sum(e["killed"] for e in entries),
            leaks=sum(e["leaks"] for e in entries),
            wrong_removals=sum(e["wrong_removals"] for e in entries),
            hook_runs=sum(e["hook_runs"] or 0 for e in entries),
            kinds=entries,
            figures=report.ends(sampler.samples),
            reap_latency_by_kind=latency,
            audit_refusals_and_failures=dict(other),
            by_actor=out.figures,
            agent_counters=out.counters,
            agent_warnings=dict(warnings.most_common()),
            agent_alive=out.alive,
            violations=len(out.violations),
            logs=str(logs),
        )
    )
    for line in out.violations:
        print(line, file=sys.stderr)
    return 1 if out.violations else 0


if __name__ == "__main__":
    sys.exit(main())
