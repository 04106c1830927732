"""Labelled volumes and networks carry owners as containers do, end to end: a real agent, a
real engine, real owners SIGKILLed. A dead owner with nothing else left loses its labelled
volume and network at once with the agent running, at the agent's start, and in `exitwatch
reap`, when it died while none ran; a live owner's, a kept one and one in use by another
owner's running container stay. (Before, the agent found owners by their containers alone:
each of these found nothing.)"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import docker.errors

from exitwatch import owner_labels
from exitwatch.contract import LABEL_KEEP

from support.agentproc import GONE_DEADLINE, quiet_config
from support.engine import PrivateEngine
from support.procs import kill, spawn_owner, wait_for


def present(engine: PrivateEngine, kind: str, name: str) -> bool:
    api = engine.client.api
    try:
        (api.inspect_network if kind == "network" else api.inspect_volume)(name)
    except docker.errors.NotFound:
        return False
    return True


def made(engine: PrivateEngine, labels: dict[str, str]) -> tuple[str, str]:
    """A volume and a network with `labels`, and no container: their names."""
    name = f"owned-{uuid.uuid4().hex[:8]}"
    engine.client.api.create_volume(f"{name}-vol", labels=labels)
    engine.client.api.create_network(f"{name}-net", labels=labels)
    return f"{name}-vol", f"{name}-net"


def wait_both_gone(engine: PrivateEngine, vol: str, net: str) -> None:
    wait_for(
        lambda: not present(engine, "volume", vol) and not present(engine, "network", net),
        timeout=GONE_DEADLINE,
        what=f"volume {vol} and network {net} gone",
    )


def reap_argv(engine: PrivateEngine, tmp_path: Path) -> list[str]:
    return [
        *(sys.executable, "-m", "exitwatch", "reap", "--config", quiet_config(tmp_path)),
        *("--docker-host", engine.host, "--workdir-root", str(tmp_path / "none")),
        *("--audit-log", str(tmp_path / "audit.jsonl"), "--hook-dir", str(tmp_path / "hooks")),
    ]


def test_a_dead_owners_volume_and_network_go_within_a_second_with_the_agent_running(
    engine, start_agent
):
    agent = start_agent("netlink")
    owner = spawn_owner()
    vol, net = made(engine, owner_labels(owner.pid))

    def held() -> bool:
        mine = [o for o in agent.status()["owners"] if o["pid"] == owner.pid]
        return bool(mine) and (mine[0]["volumes"], [n["name"] for n in mine[0]["networks"]]) == (
            [{"name": vol, "project": None, "engine": engine.host}],
            [net],
        )

    wait_for(held, timeout=30, what="the agent to hold the owner's volume and network")
    kill(owner, signal.SIGKILL)
    wait_both_gone(engine, vol, net)
    reaps = {r["what"]: r for r in agent.status()["reaps"]}
    for what in (f"volume {vol}", f"network {net}"):
        assert reaps[what]["result"] == "removed" and reaps[what]["kind"] in what
        # From the death noticed to the removal, as the agent measured it.
        assert reaps[what]["latency_ms"] < 1000, reaps[what]


def test_a_volume_created_after_its_owners_death_goes_too(engine, start_agent):
    start_agent("netlink")
    owner = spawn_owner()
    labels = owner_labels(owner.pid)
    kill(owner, signal.SIGKILL)
    vol, net = made(engine, labels)  # found on the events stream, its owner dead already
    wait_both_gone(engine, vol, net)


def test_what_stays_a_live_owners_a_kept_one_and_one_in_use(engine, start_agent):
    agent = start_agent("netlink", "--reconcile-interval", "1")
    live, dead = spawn_owner(), spawn_owner()
    try:
        live_vol, live_net = made(engine, owner_labels(live.pid))
        kept_vol, kept_net = made(engine, owner_labels(dead.pid) | {LABEL_KEEP: "true"})
        used = f"used-{uuid.uuid4().hex[:8]}"
        engine.client.api.create_volume(used, labels=owner_labels(dead.pid))
        host = engine.client.api.create_host_config(binds={used: {"bind": "/v", "mode": "rw"}})
        user = engine.client.api.create_container(
            engine.image, "sleep infinity", labels=owner_labels(live.pid), host_config=host
        )["Id"]
        engine.client.api.start(user)
        gone_vol, gone_net = made(engine, owner_labels(dead.pid))
        kill(dead, signal.SIGKILL)
        wait_both_gone(engine, gone_vol, gone_net)
        # The volume in use fails its attempts (tried again, then at every reconcile).
        agent.wait_log(f"volume {used}", what="the agent's attempt at the volume in use")
        assert present(engine, "volume", used)
        for vol, net in ((live_vol, live_net), (kept_vol, kept_net)):
            assert present(engine, "volume", vol) and present(engine, "network", net)
        # Once its user goes, a retry or the next reconcile removes it.
        engine.client.api.remove_container(user, force=True)
        wait_for(lambda: not present(engine, "volume", used), timeout=GONE_DEADLINE, what=used)
    finally:
        kill(live, signal.SIGKILL)


def test_at_start_and_in_reap_when_the_owner_died_while_no_agent_ran(engine, start_agent, tmp_path):
    owner = spawn_owner()
    first = made(engine, owner_labels(owner.pid))
    kill(owner, signal.SIGKILL)
    agent = start_agent("netlink")
    wait_both_gone(engine, *first)
    agent.stop()  # `exitwatch reap` is for when none runs

    owner = spawn_owner()
    vol, net = made(engine, owner_labels(owner.pid))
    kill(owner, signal.SIGKILL)
    argv = reap_argv(engine, tmp_path)
    dry = subprocess.run([*argv, "--dry-run"], capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    assert f"would reap volume {vol}" in dry.stderr and f"would reap network {net}" in dry.stderr
    assert present(engine, "volume", vol) and present(engine, "network", net)
    real = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert real.returncode == 0, real.stderr
    assert not present(engine, "volume", vol) and not present(engine, "network", net)
    audit = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert sorted((e["kind"], e["dry_run"]) for e in audit) == [
        ("network", False),
        ("network", True),
        ("volume", False),
        ("volume", True),
    ]
