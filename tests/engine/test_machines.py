"""Two machines that share an engine and a filesystem, as two hosts share a Docker engine
or an NFS export: the other machine is a runner in a mount namespace of its own, with
another /etc/machine-id and another boot id bind-mounted over this host's. It labels a
container (`exitwatch labels`, then `docker run`), marks a workdir (`exitwatch mark`) and
registers an on-death hook, on this suite's private engine, under the agent's workdir root
and in its hook spool. The agent leaves all of it alone while that runner lives and after
it is SIGKILLed (another machine's owner is not its to judge), tells of it once, and shows
it in status and the metrics. A runner of an earlier boot of this machine (this machine's
id, another boot id) is dead, and what it made goes at once."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from exitwatch.owner import Owner, current_machine_id

from support.agentproc import NO_LEFTOVERS, exists, free_port, scrape, wait_gone
from support.cli import status
from support.procs import wait_for

OTHER_MACHINE = "2" * 32 if current_machine_id() == "1" * 32 else "1" * 32


@dataclass
class Runner:
    """A runner's shell (the owner of all it made) and what it made."""

    proc: subprocess.Popen
    owner: Owner
    container: str
    workdir: Path
    ran: Path  # made by its hook, if that ever runs

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(30)


def _runner(engine, workroot: Path, home: Path, boot_id: str, machine_id: str | None) -> Runner:
    """A runner whose mount namespace shows `boot_id` and `machine_id` (None: this
    machine's own), alive until killed; it has made its container, workdir and hook."""
    home.mkdir()
    mounts = []
    for text, target in (
        (boot_id, "/proc/sys/kernel/random/boot_id"),
        (machine_id, "/etc/machine-id"),
    ):
        if text is not None:
            name = Path(target).name
            (home / name).write_text(text + "\n")
            mounts.append(f"mount --bind {home / name} {target}")
    workdir = workroot / home.name
    exitwatch = f"{sys.executable} -m exitwatch"
    # The shell is the owner of everything (exitwatch labels and mark name their parent);
    # unshare execs it, so its pid is the Popen's. It waits on its stdin until killed.
    script = "\n".join(
        [
            "set -e",
            *mounts,
            f"args=$({exitwatch} labels --format docker-args)",
            # A dead owner's container may be removed between its creation and its start.
            f"docker run -d --cidfile {home}/cid --name {home.name}-{uuid.uuid4().hex[:8]} "
            f"$args {engine.image} sleep infinity > /dev/null || test -s {home}/cid",
            f"mkdir {workdir} && {exitwatch} mark {workdir}",
            f"{exitwatch} on-death -- touch {home}/ran > /dev/null",
            f"{exitwatch} labels > {home}/labels",
            f"touch {home}/ready",
            "read _",
        ]
    )
    proc = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        stdin=subprocess.PIPE,
        stderr=(home / "stderr").open("wb"),
        env=engine.env(),
    )

    def ready() -> bool:
        if proc.poll() is not None:
            raise AssertionError(
                f"runner exited {proc.returncode}: {(home / 'stderr').read_text()}"
            )
        return (home / "ready").exists()

    wait_for(ready, timeout=60, what=f"runner {home.name} to make its things")
    owner = Owner.parse(json.loads((home / "labels").read_text())["exitwatch.owner"])
    assert owner.pid == proc.pid and owner.boot_id == boot_id
    assert owner.machine == (machine_id or current_machine_id())
    cid = (home / "cid").read_text().strip()
    return Runner(proc, owner, cid, workdir, home / "ran")


@pytest.fixture
def machines_agent(start_agent, spool):
    """An agent that reconciles every second (each judges every owner again), with
    metrics."""
    port = free_port()
    agent = start_agent(
        "netlink",
        "--hook-dir",
        str(spool),
        "--reconcile-interval",
        "1",
        "--metrics-addr",
        f"127.0.0.1:{port}",
    )
    return agent, port


def _elsewhere(agent) -> list[dict]:
    return agent.status()["elsewhere"]


def test_another_machines_owner_is_left_alone_alive_and_dead(
    engine, workroot, tmp_path, spool, machines_agent
):
    agent, port = machines_agent
    other = _runner(engine, workroot, tmp_path / "other", str(uuid.uuid4()), OTHER_MACHINE)
    earlier = _runner(engine, workroot, tmp_path / "earlier", str(uuid.uuid4()), None)
    try:
        # An earlier boot of this machine: dead, though its shell still runs here.
        wait_gone(engine, [earlier.container], [earlier.workdir])
        wait_for(earlier.ran.exists, timeout=30, what="the earlier boot's hook to run")
        assert f"owner={earlier.owner}" in agent.text()
        assert "boot id differs (host rebooted)" in agent.text()

        def held() -> list[dict]:
            away = _elsewhere(agent)
            kinds = ("containers", "workdirs", "hooks")
            return away if away and all(away[0][k] for k in kinds) else []

        (entry,) = wait_for(held, timeout=30, what="the other machine's owner in status")
        assert entry["owner"] == str(other.owner) and entry["pid"] == other.proc.pid
        assert entry["machine"] == OTHER_MACHINE
        assert entry["why"] == f"of machine {OTHER_MACHINE}, not this one"
        assert [c["id"] for c in entry["containers"]] == [other.container]
        assert entry["workdirs"] == [str(other.workdir)]
        assert all(o["owner"] != str(other.owner) for o in agent.status()["owners"])

        other.kill()  # SIGKILL: it is dead now, on this host's pids as on its own
        run = agent.status()["reconcile"]["last"]["run"]
        wait_for(
            lambda: agent.status()["reconcile"]["last"]["run"] >= run + 2,
            timeout=30,
            what="two reconciles after the kill, each judging every owner again",
        )
        assert exists(engine, other.container)
        assert other.workdir.is_dir() and not other.ran.exists()
        assert len(list(spool.iterdir())) == 1  # its hook, waiting
        (entry,) = _elsewhere(agent)
        assert entry["owner"] == str(other.owner)
        told = f"owner {other.owner} is of machine {OTHER_MACHINE}, not this one"
        assert agent.text().count(told) == 1, agent.text()
        assert f"owner={other.owner}" not in agent.text()  # no removal, no refusal
        assert "exitwatch_owners_elsewhere 1.0" in scrape(port)
        shown = status(agent.flag("--status-socket"))
        assert "other machines' owners, left alone: 1" in shown.stdout
        assert f"machine:  {current_machine_id()}" in shown.stdout

        # Without the agent: the one-shot scan shows it, and `exitwatch reap` leaves it.
        config = tmp_path / "config.toml"
        config.write_text(
            f'{NO_LEFTOVERS}workdir_roots = ["{workroot}"]\ndocker_host = "{engine.host}"\n'
            f'hook_dir = "{spool}"\naudit_log = "{tmp_path / "audit.jsonl"}"\n'
        )
        none = str(tmp_path / "none.sock")
        scan = status(none, "--json", "--config", str(config))
        assert scan.returncode == 3, scan.stderr
        (entry,) = json.loads(scan.stdout)["elsewhere"]
        assert entry["owner"] == str(other.owner)
        reaped = subprocess.run(
            [sys.executable, "-m", "exitwatch", "reap", "--config", str(config)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert reaped.returncode == 0, reaped.stderr
        assert reaped.stderr.count(told) == 1, reaped.stderr
        assert exists(engine, other.container) and other.workdir.is_dir()
        assert not other.ran.exists()
    finally:
        for runner in (other, earlier):
            if runner.proc.poll() is None:
                runner.kill()
        engine.client.api.remove_container(other.container, force=True)
