"""The agent end to end: a real agent process, the real kernel, real processes killed with
real signals, a real Docker engine and real directories."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from exitwatch import mark_workdir, owner_labels
from exitwatch.contract import LABEL_OWNER

from support.agentproc import container, exists, quiet_config, wait_gone
from support.procs import (
    exit_main_thread,
    kill,
    reap,
    release,
    reused_pid_owner,
    spawn_main_thread_exits_first,
    spawn_owner,
    state,
    wait_for,
)

SOURCES = ["ebpf", "netlink", "poll"]


def workdir(root: Path, pid: int | None, name: str = "w") -> Path:
    path = root / name
    (path / "sub").mkdir(parents=True)
    (path / "sub" / "data").write_bytes(b"x" * 1000)
    mark_workdir(path, pid)
    return path


@pytest.mark.parametrize("source", SOURCES)
def test_sigkilled_owner_loses_its_container_and_workdir(engine, start_agent, workroot, source):
    agent = start_agent(source)
    owner = spawn_owner()
    cid = container(engine, owner.pid)
    path = workdir(workroot, owner.pid)
    kill(owner, signal.SIGKILL)  # at once: the agent may learn of the workdir after the death
    wait_gone(engine, [cid], [path])

    # An owner the agent held before its death: the exit event tells how it died.
    held = spawn_owner()
    held_cid = container(engine, held.pid)
    agent.wait_holding(held.pid, containers=1)
    kill(held, signal.SIGKILL)
    wait_gone(engine, [held_cid])
    needle = f"reaped container {held_cid[:12]}"
    agent.wait_log(needle)
    line = next(line for line in agent.text().splitlines() if needle in line)
    # Polling learns the wait status only if it sees the zombie. The hint's confirm may
    # also find the owner still a zombie of this test process: "zombie, killed by SIGKILL".
    if source != "poll":
        assert "killed by SIGKILL" in line.partition("death=")[2], line


@pytest.mark.parametrize("source", SOURCES)
def test_live_owner_is_untouched_while_a_dead_one_is_reaped(engine, start_agent, workroot, source):
    start_agent(source)
    alive, doomed = spawn_owner(), spawn_owner()
    kept = [container(engine, alive.pid), container(engine, alive.pid)]
    kept_dir = workdir(workroot, alive.pid, "alive")
    cid = container(engine, doomed.pid)
    path = workdir(workroot, doomed.pid, "doomed")
    kill(doomed)
    wait_gone(engine, [cid], [path])
    assert all(exists(engine, c) for c in kept)
    assert (kept_dir / "sub" / "data").exists()
    reap(alive)


@pytest.mark.parametrize("source", SOURCES)
def test_reused_pid_counts_as_dead(engine, start_agent, workroot, source):
    start_agent(source)
    impostor = reused_pid_owner()  # this very process, with another start time
    cid = container(engine, labels={LABEL_OWNER: str(impostor)})
    path = workroot / "reused"
    path.mkdir()
    (path / ".exitwatch-owner").write_text(f'{{"owner": "{impostor}"}}')
    wait_gone(engine, [cid], [path])


@pytest.mark.parametrize("source", SOURCES)
def test_zombie_owner_is_reaped(engine, start_agent, workroot, source):
    start_agent(source)
    owner = spawn_owner(exit_code=7)
    cid = container(engine, owner.pid)
    path = workdir(workroot, owner.pid)
    release(owner)  # it exits; nobody waits for it yet
    wait_for(lambda: state(owner.pid) == "Z", what="the owner to be a zombie")
    wait_gone(engine, [cid], [path])
    assert state(owner.pid) == "Z"
    reap(owner)


@pytest.mark.parametrize("source", SOURCES)
def test_owner_whose_main_thread_exits_first_is_reaped_at_its_last_thread(
    engine, start_agent, workroot, source
):
    agent = start_agent(source)
    owner = spawn_main_thread_exits_first()
    cid = container(engine, owner.pid)
    path = workdir(workroot, owner.pid)
    exit_main_thread(owner)

    def leader_gone_threads_left() -> bool:
        with open(f"/proc/{owner.pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
        return rest[0] == "Z" and int(rest[17]) > 1

    wait_for(leader_gone_threads_left, what="the main thread to exit while the other lives")
    # A second owner's death is handled after the main thread's exit hint: once its
    # container is gone, the agent has already judged the first owner.
    marker = spawn_owner()
    marker_cid = container(engine, marker.pid)
    kill(marker)
    wait_gone(engine, [marker_cid])
    assert exists(engine, cid)
    assert path.exists()
    # Nor is a removal of it under way: the agent never judged it dead.
    assert str(owner.owner) not in agent.text()
    release(owner)
    wait_gone(engine, [cid], [path])
    reap(owner)


def test_startup_reconcile_reaps_what_died_while_the_agent_was_down(engine, start_agent, workroot):
    before = spawn_owner()
    early = container(engine, before.pid)
    early_dir = workdir(workroot, before.pid, "early")
    kill(before)
    agent = start_agent("netlink")
    wait_gone(engine, [early], [early_dir])

    owner = spawn_owner()
    cid = container(engine, owner.pid)
    path = workdir(workroot, owner.pid, "late")
    agent.stop()
    kill(owner)
    start_agent("netlink")
    wait_gone(engine, [cid], [path])


def test_compose_project_goes_as_a_whole(engine, start_agent, tmp_path):
    start_agent("netlink")
    owner = spawn_owner()
    (tmp_path / "docker-compose.yml").write_text(
        textwrap.dedent(f"""\
        version: "3"
        services:
          main:
            image: {engine.image}
            command: sleep infinity
            labels:
              exitwatch.owner: "${{EXITWATCH_OWNER}}"
            networks: [inner]
          sidecar:
            image: {engine.image}
            command: sleep infinity
            networks: [inner]
        networks:
          inner: {{}}
        """)
    )
    env = {"EXITWATCH_OWNER": owner_labels(owner.pid)[LABEL_OWNER]}
    engine.compose("-p", "benchproj", "up", "-d", cwd=tmp_path, env=env)
    project = {"label": "com.docker.compose.project=benchproj"}
    api = engine.client.api  # the low-level listings: no inspect of each, so no race
    assert len(api.containers(all=True, filters=project)) == 2
    assert api.networks(filters=project)
    kill(owner)
    wait_for(
        lambda: not api.containers(all=True, filters=project),
        what="every container of the project gone",
    )
    wait_for(lambda: not api.networks(filters=project), what="the project's network gone")


def test_container_created_after_its_owners_death_is_reaped(engine, start_agent, workroot):
    start_agent("netlink")
    owner = spawn_owner()
    labels = owner_labels(owner.pid)
    path = workroot / "posthumous"
    path.mkdir()
    mark_workdir(path, owner.pid)
    marker = (path / ".exitwatch-owner").read_bytes()
    kill(owner)
    cid = container(engine, labels=labels)
    later = workroot / "posthumous-2"
    later.mkdir()
    (later / ".exitwatch-owner").write_bytes(marker)
    wait_gone(engine, [cid], [path, later])


def test_reap_dry_run_removes_nothing_and_reap_removes(engine, workroot, tmp_path):
    owner = spawn_owner()
    cid = container(engine, owner.pid)
    path = workdir(workroot, owner.pid)
    kill(owner)
    argv = [
        sys.executable,
        "-m",
        "exitwatch",
        "reap",
        "--config",
        quiet_config(tmp_path),
        "--docker-host",
        engine.host,
        "--workdir-root",
        str(workroot),
        "--audit-log",
        str(tmp_path / "audit.jsonl"),
    ]
    dry = subprocess.run([*argv, "--dry-run"], capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    assert "would reap container" in dry.stderr
    assert "would reap workdir" in dry.stderr
    assert exists(engine, cid)
    assert (path / "sub" / "data").exists()
    real = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert real.returncode == 0, real.stderr
    assert not exists(engine, cid)
    assert not path.exists()
    # Each removal, the dry run's too, is a line of the audit log, as the agent's are.
    audit = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert sorted((e["kind"], e["dry_run"]) for e in audit) == [
        ("container", False),
        ("container", True),
        ("workdir", False),
        ("workdir", True),
    ]
