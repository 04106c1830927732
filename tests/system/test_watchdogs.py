"""Watchdogs end to end: a real agent, real runners that pet, stop (SIGSTOP), block, ignore
SIGTERM or are not what their watchdog names, and a real unprivileged user who tries to arm
one on root's process."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from exitwatch import alive
from exitwatch.alive import WATCHDOG_FILE
from exitwatch.contract import add_entry
from exitwatch.kinds.base import Acted
from exitwatch.kinds.watchdogs import kind as watchdogs
from exitwatch.owner import Owner, owner_of

from support.alive import Runner, engineless_agent
from support.procs import kill, spawn_owner, wait_for
from support.users import SYSTEM_PYTHON, as_user, attacker_user

DEADLINE = 30.0  # for what is not timed: a correct agent on a loaded machine
SLACK = 1.0  # "reaped within its timeout plus a second"


def last_pet(runner: Runner) -> float:
    return float(runner.said("pet")[-1].split()[1])


def test_a_runner_that_pets_lives_on_and_its_watchdog_goes_with_it(
    alive_agent, alive_spools, tmp_path
):
    runner = Runner(
        """
w = alive.watchdog(1.0, grace=0.5)
ready()
end = time.monotonic() + 4
while time.monotonic() < end:
    w.pet(); said("pet", time.monotonic()); time.sleep(0.2)
said("done")
""",
        alive_spools,
        tmp_path,
    )
    wait_for(lambda: runner.said("done") or not runner.alive(), DEADLINE, "the runner's 4 s")
    assert runner.proc.wait(timeout=DEADLINE) == 0
    assert runner.said("SIGTERM") == []
    # Its owner dead (it ended by itself), the watchdog is removed like any resource.
    wait_for(lambda: not os.listdir(alive_spools.watchdogs), DEADLINE, "its watchdog removed")
    assert alive_agent.status()["watchdogs"]["fired"] == 0


def test_a_stopped_runner_is_ended_and_reaped_within_its_timeout_plus_a_second(
    alive_agent, alive_spools, tmp_path
):
    workdir = alive_spools.top / "root" / "held"
    workdir.mkdir()
    runner = Runner(
        f"""
from exitwatch import mark_workdir
mark_workdir({str(workdir)!r})
w = alive.watchdog(2.0, grace=5)
for _ in range(3):
    w.pet(); said("pet", time.monotonic()); time.sleep(0.1)
ready()
time.sleep(3600)
""",
        alive_spools,
        tmp_path,
    )
    wait_for(lambda: runner.said("ready"), DEADLINE, "the runner armed")
    alive_agent.wait_holding(runner.pid, workdirs=1)
    os.kill(runner.pid, signal.SIGSTOP)  # hung: it pets no more
    petted = last_pet(runner)
    wait_for(lambda: not workdir.exists(), 2.0 + SLACK + 1, "its workdir reaped")
    gone = time.monotonic()
    assert not runner.alive()
    # Ended by SIGTERM, which it acted on although stopped: SIGCONT came with it.
    assert runner.proc.returncode == 143 and runner.said("SIGTERM")
    assert float(runner.said("SIGTERM")[0].split()[1]) - petted >= 2.0
    assert gone - petted <= 2.0 + SLACK
    audit = [
        json.loads(line) for line in Path(alive_agent.flag("--audit-log")).read_text().splitlines()
    ]
    [ended] = [
        a for a in audit if a["kind"] == "watchdog" and "ended by its watchdog" in a["death"]
    ]
    assert ended["owner"] == str(owner_of_dead(runner, audit))
    assert ended["death"].startswith("ended by its watchdog after 2")
    assert ended["extra"]["watchdog"]["timeout"] == 2.0
    alive_agent.wait_log("ended owner pid")
    firing = alive_agent.status()["watchdogs"]["recent"][-1]
    assert firing["owner"] == ended["owner"] and not firing["killed"]


def owner_of_dead(runner: Runner, audit: list[dict]) -> str:
    """The owner string of the runner, from what was reaped of it (it is dead now)."""
    return next(a["owner"] for a in audit if f":{runner.pid}:" in a["owner"])


def test_a_blocked_runner_that_ignores_sigterm_is_killed_after_its_grace(
    alive_agent, alive_spools, tmp_path
):
    runner = Runner(
        """
w = alive.watchdog(1.0, grace=1.0, reason="the test's blocked runner")
w.pet(); said("pet", time.monotonic())
ready()
threading.Event().wait()  # a deadlock: no pet ever again
""",
        alive_spools,
        tmp_path,
        env={"RUNNER_IGNORES_TERM": "1"},
    )
    wait_for(lambda: not runner.alive(), 1.0 + 1.0 + SLACK + 1, "the runner ended")
    assert runner.proc.returncode == -signal.SIGKILL
    petted = last_pet(runner)
    termed = float(runner.said("SIGTERM")[0].split()[1])
    assert 1.0 <= termed - petted <= 1.0 + SLACK
    assert runner.ended is not None and runner.ended - termed >= 1.0  # its grace, whole
    alive_agent.wait_log("SIGKILL sent")
    health = alive_agent.status()["watchdogs"]
    assert (health["fired"], health["killed"]) == (1, 1) and health["recent"][0]["killed"]
    assert "(the test's blocked runner)" in alive_agent.text()


def test_a_reused_pid_is_never_killed(alive_agent, alive_spools, tmp_path):
    """A watchdog whose owner died and whose pid a live process has now: the agent judges
    the owner by its start time, finds it dead, and signals no one."""
    victim = Runner("ready()\ntime.sleep(3600)", alive_spools, tmp_path)
    try:
        wait_for(lambda: victim.said("ready"), DEADLINE, "the process on the pid")
        now = owner_of(victim.pid)
        earlier = Owner(now.boot_id, now.pid, now.starttime - 1, now.machine)  # same pid
        body = {"owner": str(earlier), "timeout": 1.0, "grace": 0.0, "created": time.time()}
        add_entry(
            str(alive_spools.watchdogs),
            alive.watchdog_id(earlier),
            WATCHDOG_FILE,
            json.dumps(body).encode(),
        )
        # Dead by its start time: its watchdog is reaped as a dead owner's, and nothing fires.
        wait_for(
            lambda: not os.listdir(alive_spools.watchdogs), DEADLINE, "the dead owner's watchdog"
        )
        alive_agent.wait_log("reaped watchdog")
        assert victim.alive() and victim.said("SIGTERM") == []
        assert alive_agent.status()["watchdogs"]["fired"] == 0
    finally:
        victim.kill()


def test_another_user_cannot_arm_a_watchdog_on_roots_process(alive_agent, alive_spools, tmp_path):
    attacker = attacker_user()
    victim = Runner("ready()\ntime.sleep(3600)", alive_spools, tmp_path)
    try:
        wait_for(lambda: victim.said("ready"), DEADLINE, "root's process")
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(alive.__file__).parents[1])}
        env |= alive_spools.env
        # Through the CLI: refused, with one line, and nothing written.
        cli = as_user(
            attacker,
            f'exec {SYSTEM_PYTHON} -m exitwatch watchdog --timeout 1 --pid "$1"',
            str(victim.pid),
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        _, err = cli.communicate(timeout=60)
        assert cli.returncode == 1, err
        assert "only its own user or root may arm a watchdog on it" in err
        assert "Traceback" not in err and os.listdir(alive_spools.watchdogs) == []
        # Written by hand, past the library: the agent refuses it, and never signals.
        plant = (
            "import json, sys, time; from exitwatch import alive, contract; "
            "o = sys.argv[1]; "
            "b = {'owner': o, 'timeout': 1.0, 'grace': 0.0, 'created': time.time()}; "
            "contract.add_entry(alive.watchdog_dir(), alive.watchdog_id(o), 'watchdog.json', "
            "json.dumps(b).encode())"
        )
        done = as_user(
            attacker,
            f'exec {SYSTEM_PYTHON} -c "$1" "$2"',
            plant,
            str(owner_of(victim.pid)),
            env=env,
        )
        assert done.wait(timeout=60) == 0
        alive_agent.wait_log(f"runs as uid 0, not as uid {attacker.pw_uid} who armed it")
        assert victim.alive() and victim.said("SIGTERM") == []
        assert alive_agent.status()["watchdogs"]["refused"] == 1
    finally:
        victim.kill()


def test_a_watchdog_never_fires_while_its_owner_cannot_be_read(alive_spools, monkeypatch, caplog):
    """EMFILE when the agent opens the owner's pidfd: nothing is proven, nothing fires, it
    is said once and counted; once the owner can be read again, it fires."""
    owner = spawn_owner()
    try:
        arm = alive.watchdog(1.0, pid=owner.pid, grace=0.0)
        real, blind = watchdogs.owners.pidfd, threading.Event()
        blind.set()

        def pidfd(who: Owner) -> int | None:
            if blind.is_set():
                raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
            return real(who)

        monkeypatch.setattr(watchdogs.owners, "pidfd", pidfd)
        kind = watchdogs.Watchdogs(str(alive_spools.watchdogs))
        told: list = []
        kind.start(told.append)
        try:
            wait_for(lambda: kind.health()["unreadable"] >= 3, DEADLINE, "three looks that failed")
            assert owner.proc.poll() is None  # 3 s past its timeout: alive
            assert kind.health()["fired"] == 0 and not [c for c in told if isinstance(c, Acted)]
            said = [
                r
                for r in caplog.records
                if "cannot look now, so it does not fire" in r.getMessage()
            ]
            assert len(said) == 1 and "Too many open files" in said[0].getMessage()
            blind.clear()
            wait_for(lambda: owner.proc.poll() is not None, 1.0 + SLACK + 1, "the owner ended")
            [acted] = [c for c in told if isinstance(c, Acted)]
            assert acted.owner == arm.owner and acted.why.startswith("ended by its watchdog")
        finally:
            kind.stop()
    finally:
        if owner.proc.poll() is None:
            kill(owner)


def test_rearming_sets_a_new_timeout_and_counts_as_a_pet(alive_agent, alive_spools, tmp_path):
    runner = Runner(
        """
w = alive.watchdog(30.0, grace=0)
ready()
time.sleep(0.5)
alive.watchdog(1.0, grace=0); said("pet", time.monotonic())
time.sleep(3600)
""",
        alive_spools,
        tmp_path,
    )
    wait_for(lambda: runner.said("pet"), DEADLINE, "armed again")
    wait_for(lambda: not runner.alive(), 1.0 + SLACK + 1, "ended after the new timeout")
    assert runner.ended is not None and runner.ended - last_pet(runner) <= 1.0 + SLACK


def test_the_cli_arms_pets_and_cancels(alive_spools):
    owner = spawn_owner()
    try:
        exitwatch = [sys.executable, "-m", "exitwatch", "watchdog", "--pid", str(owner.pid)]
        env = os.environ | alive_spools.env
        armed = subprocess.run(
            [*exitwatch, "--timeout", "60"], capture_output=True, text=True, env=env, check=True
        )
        wid = armed.stdout.strip()
        file = alive_spools.watchdogs / wid / WATCHDOG_FILE
        body = json.loads(file.read_text())
        assert (body["timeout"], body["grace"]) == (60.0, alive.WATCHDOG_GRACE)
        assert (
            file.stat().st_mode & 0o777,
            (alive_spools.watchdogs / wid).stat().st_mode & 0o777,
        ) == (
            0o600,
            0o700,
        )
        before = file.stat().st_ctime_ns
        wait_for(lambda: time.time_ns() > before + 10_000_000, 5, "the clock to move on")
        subprocess.run([*exitwatch, "--pet"], env=env, check=True, capture_output=True)
        assert file.stat().st_ctime_ns > before
        subprocess.run([*exitwatch, "--cancel"], env=env, check=True, capture_output=True)
        assert os.listdir(alive_spools.watchdogs) == []
        again = subprocess.run([*exitwatch, "--pet"], env=env, capture_output=True, text=True)
        assert again.returncode == 1 and "no watchdog of yours on process" in again.stderr
        both = subprocess.run(
            [*exitwatch, "--pet", "--cancel"], env=env, capture_output=True, text=True
        )
        assert (
            both.returncode == 2
            and "give one of --timeout S (arm), --pet or --cancel" in both.stderr
        )
    finally:
        kill(owner)


def test_a_dry_run_agent_says_what_it_would_end_and_ends_nothing(alive_spools, tmp_path):
    agent = engineless_agent(alive_spools, tmp_path, "--dry-run")
    runner = Runner(
        "alive.watchdog(1.0, grace=0)\nready()\ntime.sleep(3600)", alive_spools, tmp_path
    )
    try:
        agent.wait_log("would end owner", what="the dry run's line")
        assert runner.alive() and runner.said("SIGTERM") == []
        assert agent.status()["watchdogs"]["fired"] == 0
    finally:
        runner.kill()
        agent.stop()
