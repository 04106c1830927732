"""`exitwatch run` with the private engine: whatever a run made there goes when it is
SIGKILLed or SIGTERMed, status shows a run like any owner, and the agent reaps a
SIGKILLed wrapper. system/test_run.py has the run without an engine."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from exitwatch.contract import LABEL_OWNER
from exitwatch.owner import owner_of

from support.agentproc import GONE_DEADLINE, NO_LEFTOVERS, running
from support.procs import wait_for
from support.wrapper import RUN, env_for, run

MAKES = r"""
docker run -d --name made $IMAGE sleep 1000 >/dev/null
docker network create madenet >/dev/null
docker volume create madevol >/dev/null
mkdir -p "$TMPDIR/a/b" && echo x > "$TMPDIR/a/b/f"
echo "$TMPDIR"
kill -9 $$
"""


def test_everything_goes_after_cmd_is_sigkilled(engine, bases) -> None:
    engine.docker("run", "-d", "--name", "outsider", engine.image, "sleep", "1000")
    done = run(["--", "sh", "-c", MAKES], env_for(bases, engine, IMAGE=engine.image))
    assert done.returncode == 137, done.stderr
    assert "exitwatch run" not in done.stderr  # nothing it could not remove
    api = engine.client.api
    owned = {"label": LABEL_OWNER}
    assert api.containers(all=True, filters=owned) == []
    assert api.networks(filters=owned) == []
    assert api.volumes(filters=owned)["Volumes"] in (None, [])
    assert [c["Names"] for c in api.containers(all=True)] == [["/outsider"]]
    assert list(bases.iterdir()) == []


def test_status_shows_a_run_like_any_owner(engine, bases, tmp_path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(
        f'{NO_LEFTOVERS}workdir_roots = ["{bases}"]\nstatus_socket = "{tmp_path}/none"\n'
    )
    script = (
        "docker run -d --name held $IMAGE sleep 1000 >/dev/null; "
        f"{sys.executable} -m exitwatch status --json --config {config}; true"
    )
    done = run(["--", "sh", "-c", script], env_for(bases, engine, IMAGE=engine.image))
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    (entry,) = [o for o in doc["owners"] if any(c["name"] == "held" for c in o["containers"])]
    assert len(entry["workdirs"]) == 2 and all(Path(w).parent == bases for w in entry["workdirs"])


MAKES_AND_WAITS = r"""
docker run -d --name made -v bindvol:/b --mount type=volume,src=mountvol,dst=/m \
    -v pre:/p $IMAGE sleep 1000 >/dev/null
docker network create madenet >/dev/null
docker volume create madevol >/dev/null
docker network create --label exitwatch.keep=true keptnet >/dev/null
echo "$TMPDIR"
exec sleep 1000
"""


def test_the_agent_reaps_a_sigkilled_wrapper(engine, workroot, tmp_path) -> None:
    live = {LABEL_OWNER: str(owner_of())}  # another run's, alive: it stays
    engine.client.api.create_network("livenet", labels=live)
    engine.client.api.create_volume("livevol", labels=live)
    engine.client.api.create_volume("pre")  # the run mounts it: it stays, unlabelled
    # With the process kind: the run's `sleep` is left running, and the agent kills it.
    with running(engine, workroot, tmp_path / "agent.log", leftovers=True) as agent:
        proc = subprocess.Popen(
            [*RUN, "--", "sh", "-c", MAKES_AND_WAITS],
            env=env_for(workroot, engine, IMAGE=engine.image),
            stdout=subprocess.PIPE,
            text=True,
        )
        assert Path(proc.stdout.readline().strip()).parent == workroot
        agent.wait_holding(proc.pid, containers=1, workdirs=2)
        proc.kill()
        proc.wait()
        api = engine.client.api

        def reaped() -> bool:
            names = [n["Name"] for n in api.networks(filters={"label": LABEL_OWNER})]
            vols = [v["Name"] for v in api.volumes(filters={"label": LABEL_OWNER})["Volumes"] or []]
            return (
                not api.containers(all=True, filters={"label": LABEL_OWNER})
                and names == ["livenet"]
                and vols == ["livevol"]
                and not list(workroot.iterdir())
            )

        wait_for(reaped, timeout=GONE_DEADLINE, what="the killed run's resources reaped")
        # Asked to be kept, it was not labelled, and it stays.
        assert LABEL_OWNER not in (api.inspect_network("keptnet")["Labels"] or {})
        # The named volumes the run's container made went (labelled); the one before it stays.
        left = {v["Name"]: v["Labels"] for v in api.volumes()["Volumes"] or []}
        assert left == {"livevol": live, "pre": None}


def test_everything_goes_after_a_sigterm_to_the_wrapper(engine, bases) -> None:
    engine.client.api.create_volume("pre")
    proc = subprocess.Popen(
        [*RUN, "--", "sh", "-c", MAKES_AND_WAITS],
        env=env_for(bases, engine, IMAGE=engine.image),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert Path(proc.stdout.readline().strip()).parent == bases
    proc.send_signal(signal.SIGTERM)  # to sleep, which dies of it
    assert proc.wait(timeout=120) == 128 + signal.SIGTERM
    api = engine.client.api
    owned = {"label": LABEL_OWNER}
    assert api.containers(all=True, filters=owned) == []
    assert api.networks(filters=owned) == [] and not api.volumes(filters=owned)["Volumes"]
    assert [v["Name"] for v in api.volumes()["Volumes"]] == ["pre"]
    assert list(bases.iterdir()) == []


def test_an_engine_gone_at_cleanup_is_named_and_its_containers_stay(engine, bases) -> None:
    proc = subprocess.Popen(
        [*RUN, "--", "sh", "-c", "docker run -d --name stays $IMAGE sleep 1000; read x"],
        env=env_for(bases, engine, IMAGE=engine.image),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    cid = proc.stdout.readline().strip()
    owner = str(owner_of(proc.pid))
    try:
        engine.stop()
        _, err = proc.communicate("\n", timeout=120)
    finally:
        engine.start()
    assert proc.returncode == 0, err
    lines = [line for line in err.splitlines() if line.startswith("exitwatch run: ")]
    # One line: the engine, why (the stopped engine took its socket away), what stays.
    assert len(lines) == 1, err
    assert lines[0].startswith(f"exitwatch run: no Docker engine answers at {engine.host}: ")
    assert lines[0].endswith(
        "; the run's containers, networks and volumes there stay, and the agent reaps them by "
        "their label once it answers again"
    )
    # Labelled, it stays for the agent (or `exitwatch reap`) to find.
    [held] = engine.client.api.containers(all=True, filters={"label": LABEL_OWNER})
    assert held["Id"] == cid and held["Labels"][LABEL_OWNER] == owner
    assert list(bases.iterdir()) == []


VOLUMES_AND_A_FAILING_BUILD = r"""
docker run --rm -v bindvol:/d $IMAGE sh -c 'echo x > /d/f'
docker run --rm --mount type=volume,src=mountvol,dst=/d $IMAGE true
docker run --rm -v pre:/d $IMAGE sh -c 'echo y > /d/g'
for v in bindvol mountvol pre; do docker volume inspect -f "$v {{json .Labels}}" $v; done
DOCKER_BUILDKIT=0 docker build -q $CONTEXT >/dev/null 2>&1 && exit 1
true
"""


def test_named_volumes_and_a_failed_build_leave_nothing(engine, bases, tmp_path) -> None:
    context = tmp_path / "ctx"
    context.mkdir()
    (context / "Dockerfile").write_text(f"FROM {engine.image}\nRUN false\n")
    api = engine.client.api
    # Directly, the legacy builder leaves the failed step's container (the run's socket
    # asks for forcerm=1 instead: docs/run.md).
    failed = subprocess.run(
        ["docker", "build", "-q", str(context)],
        env=engine.env(DOCKER_BUILDKIT="0"),
        capture_output=True,
        timeout=120,
    )
    assert failed.returncode != 0
    (left,) = api.containers(all=True)
    api.remove_container(left["Id"])
    api.create_volume("pre")

    env = env_for(bases, engine, IMAGE=engine.image, CONTEXT=str(context), DOCKER_BUILDKIT="0")
    done = run(["--", "sh", "-ec", VOLUMES_AND_A_FAILING_BUILD], env)
    assert done.returncode == 0, done.stderr
    labels = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    assert LABEL_OWNER in json.loads(labels["bindvol"]) and LABEL_OWNER in json.loads(
        labels["mountvol"]
    )
    assert labels["pre"] == "null"
    assert api.containers(all=True) == []
    assert [(v["Name"], v["Labels"]) for v in api.volumes()["Volumes"]] == [("pre", None)]
