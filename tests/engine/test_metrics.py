"""The metrics endpoint under attack, and without its library. Real agent processes, a real
unprivileged attacker with real slow clients, the real engine."""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exitwatch import mark_workdir
from exitwatch.service.metrics import MAX_CONNECTIONS

from support.agentproc import Agent, agent_argv, container, free_port, scrape, wait_gone
from support.procs import kill, spawn_owner, wait_for
from support.users import SYSTEM_PYTHON, as_user

ROOT = Path(__file__).resolve().parents[2]

# One connection per client, one byte every 0.7 s on each: each request stays unfinished.
_SLOWLORIS = r"""
import socket, sys, time
port, n, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
conns = []
for _ in range(n):
    s = socket.socket()
    s.setblocking(False)
    try:
        s.connect(("127.0.0.1", port))
    except BlockingIOError:
        pass
    conns.append(s)
print("connected", flush=True)
end = time.monotonic() + seconds
while time.monotonic() < end:
    for s in conns:
        try:
            s.send(b"G")
        except OSError:
            pass
    print("round", flush=True)
    time.sleep(0.7)
"""
CLIENTS = 1100
ROUNDS = 15


def _sockets(pid: int) -> int:
    fds = f"/proc/{pid}/fd"
    count = 0
    for fd in os.listdir(fds):
        with contextlib.suppress(FileNotFoundError):  # closed since the listing
            count += os.readlink(f"{fds}/{fd}").startswith("socket:")
    return count


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


@pytest.fixture
def agents():
    started: list[Agent] = []
    yield started
    for agent in started:
        agent.stop()


def test_slow_clients_of_the_metrics_port_neither_exhaust_fds_nor_stop_reaping(
    engine, workroot, tmp_path, attacker, agents
):
    port = free_port()
    argv = agent_argv(
        "netlink", engine.host, workroot, extra=("--metrics-addr", f"127.0.0.1:{port}")
    )
    agent = Agent(argv, tmp_path / "agent.log")
    agents.append(agent)
    agent.wait_log("ready:")
    # systemd's default soft limit, which the reported attack ran under.
    subprocess.run(["prlimit", "--pid", str(agent.pid), "--nofile=1024:1024"], check=True)
    base_sockets, base_threads = _sockets(agent.pid), _threads(agent.pid)
    owner = spawn_owner()
    cid = container(engine, owner.pid)
    wd = workroot / "held"
    wd.mkdir()
    mark_workdir(wd, owner.pid)
    agent.wait_holding(owner.pid, containers=1, workdirs=1)

    script = f'exec {SYSTEM_PYTHON} -I -S -c "$1" "$2" "$3" "$4"'
    loris = as_user(
        attacker, script, _SLOWLORIS, str(port), str(CLIENTS), "60", stdout=subprocess.PIPE
    )
    peaks = {"sockets": 0, "threads": 0}
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peaks["sockets"] = max(peaks["sockets"], _sockets(agent.pid) - base_sockets)
            peaks["threads"] = max(peaks["threads"], _threads(agent.pid) - base_threads)
            stop.wait(0.05)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        assert loris.stdout is not None and loris.stdout.readline() == b"connected\n"
        # The owner dies once the attack is in full swing: a listen queue drops SYNs, so
        # clients get in over the seconds their retries take (about 10 s for all 1,100).
        assert [loris.stdout.readline() for _ in range(ROUNDS)] == [b"round\n"] * ROUNDS
        kill(owner)
        wait_gone(engine, [cid], [wd])
    finally:
        loris.kill()
        loris.wait()
        loris.stdout.close()
        stop.set()
        sampler.join()
    # Each held client is one socket; removals add a few threads and engine connections.
    assert peaks["sockets"] <= MAX_CONNECTIONS + 8, peaks
    assert peaks["threads"] <= 24, peaks
    assert 'exitwatch_reaped_total{kind="workdir"} 1.0' in scrape(port, timeout=10)
    assert "Traceback" not in agent.text()
    assert agent.alive()


def test_every_kind_has_a_resources_watched_sample_while_it_holds_nothing(
    engine, workroot, tmp_path, agents
):
    port = free_port()
    extra = ("--metrics-addr", f"127.0.0.1:{port}")
    argv = agent_argv("netlink", engine.host, workroot, extra=extra, leftovers=True)
    agent = Agent(argv, tmp_path / "agent.log")
    agents.append(agent)
    agent.wait_log("ready:")

    def watched() -> dict[str, float]:
        families = text_string_to_metric_families(scrape(port, timeout=10))
        [family] = [f for f in families if f.name == "exitwatch_resources_watched"]
        return {s.labels["kind"]: s.value for s in family.samples}

    def mine() -> dict[str, float]:
        # The process kind is host-wide: what it holds is every live run's on the host (other
        # sessions', a bench host's), not this test's; its sample must be there all the same.
        got = watched()
        assert "process" in got, got
        del got["process"]
        return got

    # Nothing is held yet: a panel or an alert on any kind reads 0, not "no data".
    kinds = ("container", "hook", "lease", "watchdog", "workdir")
    assert mine() == dict.fromkeys(kinds, 0.0)
    owner = spawn_owner()
    cid = container(engine, owner.pid)
    agent.wait_holding(owner.pid, containers=1)
    assert mine() == dict.fromkeys(kinds, 0.0) | {"container": 1.0}
    kill(owner)
    wait_gone(engine, [cid])
    wait_for(lambda: watched()["container"] == 0.0, what="the container to leave the gauge")


_WITHOUT_PROMETHEUS = (
    "import sys; sys.modules['prometheus_client'] = None; from exitwatch.cli import main; main()"
)


def test_without_prometheus_client_the_agent_runs_and_metrics_get_one_line(
    engine, workroot, tmp_path, agents
):
    env = {"PYTHONPATH": str(ROOT)}
    argv = [
        SYSTEM_PYTHON,
        "-c",
        _WITHOUT_PROMETHEUS,
        *agent_argv("netlink", engine.host, workroot)[3:],
    ]
    agent = Agent(argv, tmp_path / "agent.log", env=env)
    agents.append(agent)
    agent.wait_log("ready:")

    port = free_port()
    done = subprocess.run(
        [*argv, "--status-socket", str(tmp_path / "2.sock"), "--metrics-addr", f"127.0.0.1:{port}"],
        capture_output=True,
        text=True,
        timeout=60,
        env=os.environ | env,
    )
    assert done.returncode == 1
    errors = [line for line in done.stderr.splitlines() if "Error" in line]
    assert errors == [
        f"Error: cannot serve metrics on 127.0.0.1:{port}: the Python package "
        "prometheus_client is not installed (Debian: apt install python3-prometheus-client; "
        "pip: the exitwatch[metrics] extra)"
    ], done.stderr
    assert "Traceback" not in done.stderr
