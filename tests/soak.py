"""The soak (`make soak`): owners with a container and a workdir die at random, continuously,
while others live; at the end no dead owner's resource is left and no live owner's is gone.
The agent's RSS and open fd count are sampled throughout and printed as a table.

SOAK_SECONDS (default 600) sets the length, SOAK_SOURCE (default auto) the exit source.
Exits 1 on a leak, a wrong removal or an agent that died. Not collected by pytest.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import docker

from exitwatch.contract import LABEL_OWNER, mark_workdir, owner_labels

from support.agentproc import Agent, agent_argv
from support.procs import Child, kill, spawn_owner

ENGINE_SH = Path(__file__).parent / "support" / "engine.sh"
# Outside tests/conftest.py's engine directory, whose purge would take this one for dead.
ENGINE_DIR = Path("/tmp/exitwatch-soak-engine")
IMAGE = "exitwatch-test/busybox:latest"
LIVE = 8  # owners alive at any moment, besides the ones that live throughout
STEADY = 4  # owners that live from start to end
SAMPLE_EVERY = 10.0  # seconds
REAP_DEADLINE = 60.0  # seconds for the last deaths to be reaped at the end


@dataclass
class Held:
    child: Child
    cid: str
    path: Path


def _engine() -> str:
    ENGINE_DIR.mkdir(parents=True, exist_ok=True)
    socket = ENGINE_DIR / "docker.sock"
    done = subprocess.run(
        [str(ENGINE_SH), "start", str(ENGINE_DIR), str(socket)],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def _sample(pid: int) -> tuple[int, int]:
    """RSS in KiB and open fds of process `pid`."""
    with open(f"/proc/{pid}/status") as f:
        rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


class Soak:
    def __init__(self, api: docker.APIClient, root: Path) -> None:
        self.api, self.root = api, root
        self.made = 0
        self.dead: list[Held] = []
        self.wrong: list[str] = []

    def own(self) -> Held:
        child = spawn_owner()
        labels = owner_labels(child.pid)
        cid = self.api.create_container(IMAGE, "sleep infinity", labels=labels)["Id"]
        self.api.start(cid)
        path = self.root / f"w{self.made}"
        (path / "sub").mkdir(parents=True)
        (path / "sub" / "data").write_bytes(os.urandom(4096))
        mark_workdir(path, child.pid)
        self.made += 1
        return Held(child, cid, path)

    def present(self) -> set[str]:
        return {c["Id"] for c in self.api.containers(all=True, filters={"label": LABEL_OWNER})}

    def check_live(self, live: list[Held]) -> None:
        ids = self.present()
        for h in live:
            if h.cid not in ids or not (h.path / "sub" / "data").exists():
                self.wrong.append(f"{h.child.owner}: {h.cid[:12]} {h.path}")

    def leaks(self) -> list[Held]:
        ids = self.present()
        return [h for h in self.dead if h.cid in ids or h.path.exists()]


def main() -> int:
    seconds = float(os.environ.get("SOAK_SECONDS", "600"))
    source = os.environ.get("SOAK_SOURCE", "auto")
    rng = random.Random(os.environ.get("SOAK_SEED", "0"))
    host = _engine()
    api = docker.APIClient(base_url=host)
    root = Path(tempfile.mkdtemp(prefix="exitwatch-soak-", dir="/tmp"))
    log = Path(tempfile.mkdtemp(prefix="exitwatch-soak-log-")) / "agent.log"
    soak = Soak(api, root)
    agent = Agent(agent_argv(source, host, root, leftovers=True), log)
    samples: list[tuple[float, int, int, int]] = []
    try:
        agent.wait_log("ready:")
        steady = [soak.own() for _ in range(STEADY)]
        live = [soak.own() for _ in range(LIVE)]
        began = time.monotonic()
        next_sample = began
        while (now := time.monotonic()) - began < seconds:
            if now >= next_sample:
                samples.append((now - began, *_sample(agent.pid), len(soak.dead)))
                next_sample += SAMPLE_EVERY
            victim = live.pop(rng.randrange(len(live)))
            kill(victim.child, signal.SIGKILL)
            soak.dead.append(victim)
            live.append(soak.own())
            soak.check_live(steady + live)
            if not agent.alive():
                break
        samples.append((time.monotonic() - began, *_sample(agent.pid), len(soak.dead)))
        for h in live:
            kill(h.child, signal.SIGKILL)
            soak.dead.append(h)
        deadline = time.monotonic() + REAP_DEADLINE
        while (left := soak.leaks()) and time.monotonic() < deadline:
            time.sleep(0.2)
        soak.check_live(steady)
        alive = agent.alive()
    finally:
        agent.stop()
        api.close()
        subprocess.run([str(ENGINE_SH), "purge", str(ENGINE_DIR)], check=False)
        shutil.rmtree(root, ignore_errors=True)
    for h in steady:
        kill(h.child)

    print("| t (s) | agent RSS (KiB) | agent fds | owners killed |")
    print("|---:|---:|---:|---:|")
    for t, rss, fds, killed in samples:
        print(f"| {t:.0f} | {rss} | {fds} | {killed} |")
    summary = {
        "seconds": round(seconds),
        "source": source,
        "owners": soak.made,
        "killed": len(soak.dead),
        "leaks": len(left),
        "wrong_removals": len(soak.wrong),
        "agent_alive": alive,
        "log": str(log),
    }
    print(json.dumps(summary))
    for h in left:
        print(f"leak: {h.child.owner} {h.cid[:12]} {h.path}", file=sys.stderr)
    for w in soak.wrong:
        print(f"wrong removal: {w}", file=sys.stderr)
    return 0 if alive and not left and not soak.wrong else 1


if __name__ == "__main__":
    sys.exit(main())
