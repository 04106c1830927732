"""`exitwatch run --max-time` and `--idle-timeout` with the private engine and a real agent:
a run whose command holds a container and overruns, or falls silent, is ended by the agent's
watchdog, and its container goes; one that keeps talking lives on; without an agent the
run refuses to start, in one line."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from exitwatch.alive import ENV_WATCHDOG_DIR
from exitwatch.contract import LABEL_OWNER

from support.agentproc import GONE_DEADLINE, running
from support.procs import wait_for
from support.wrapper import RUN, env_for, run

HOLDS = r"""
docker run -d --name held $IMAGE sleep 1000 >/dev/null
echo started
"""


TALKS = "for i in 1 2 3 4 5 6 7 8; do sleep 0.5; echo $i >&2; done"  # 4 s, never 2 s silent


def _owned(engine) -> list:
    return engine.client.api.containers(all=True, filters={"label": LABEL_OWNER})


def _start(args: list[str], script: str, env: dict[str, str]) -> tuple[subprocess.Popen, float]:
    proc = subprocess.Popen(
        [*RUN, *args, "--", "sh", "-c", script],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "started", proc.stderr.read()
    return proc, time.monotonic()


def _ended(agent) -> list[dict]:
    lines = Path(agent.flag("--audit-log")).read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["death"].startswith("ended by its watchdog")]


def test_max_time_ends_a_run_that_overruns_and_its_container_goes(engine, workroot, tmp_path):
    with running(engine, workroot, tmp_path / "agent.log") as agent:
        env = env_for(workroot, engine, IMAGE=engine.image)
        env[ENV_WATCHDOG_DIR] = agent.flag("--watchdog-dir")
        # It keeps talking: only the maximum time ends it, SIGTERM ignored by its shell.
        script = HOLDS + "trap '' TERM; while :; do echo tick; sleep 0.2; done"
        proc, started = _start(["--max-time", "3", "--grace", "1"], script, env)
        assert len(_owned(engine)) == 1
        proc.wait(timeout=60)
        took = time.monotonic() - started
        assert proc.returncode in (128 + 15, -9), proc.stderr.read()
        assert 3.0 <= took <= 3.0 + 1.0 + 2.0, took  # its time, its grace, and a margin
        wait_for(lambda: not _owned(engine), GONE_DEADLINE, "the run's container removed")
        [ended] = _ended(agent)
        assert "(exitwatch run --max-time 3)" in ended["death"]
        said = proc.stderr.read()
        assert "exitwatch run: --max-time 3 s reached: the agent's watchdog ends the run" in said


def test_idle_timeout_ends_a_silent_run_and_spares_a_talking_one(engine, workroot, tmp_path):
    with running(engine, workroot, tmp_path / "agent.log") as agent:
        env = env_for(workroot, engine, IMAGE=engine.image)
        env[ENV_WATCHDOG_DIR] = agent.flag("--watchdog-dir")
        talking, _ = _start(
            ["--idle-timeout", "2", "--grace", "1"],
            HOLDS.replace("held", "talks")
            + "for i in 1 2 3 4 5 6 7 8; do sleep 0.5; echo $i >&2; done",
            env,
        )
        silent, quiet_from = _start(
            ["--idle-timeout", "2", "--grace", "1"], HOLDS + "exec sleep 1000", env
        )
        silent.wait(timeout=60)
        took = time.monotonic() - quiet_from
        assert 2.0 <= took <= 2.0 + 1.0 + 2.0, took
        said = silent.stderr.read()
        assert silent.returncode == 128 + 15, said
        assert "no output for --idle-timeout 2 s: the agent's watchdog ends the run" in said
        # The talking one ran its 4 s whole, twice its idle timeout, and ended by itself.
        assert talking.wait(timeout=60) == 0
        assert talking.stderr.read().split() == [str(i) for i in range(1, 9)]  # all of it
        wait_for(lambda: not _owned(engine), GONE_DEADLINE, "both runs' containers removed")
        [ended] = _ended(agent)
        assert "(exitwatch run --idle-timeout 2: no output)" in ended["death"]


def test_without_an_agent_the_run_refuses_to_start(engine, bases):
    env = env_for(bases, engine) | {ENV_WATCHDOG_DIR: str(bases / "no-agent")}
    done = run(["--max-time", "5", "--", "true"], env)
    assert done.returncode == 125
    [line] = done.stderr.splitlines()
    assert line.startswith("exitwatch run: --max-time and --idle-timeout need the exitwatch agent")
    assert "is the agent running?" in line
