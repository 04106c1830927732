"""The podman CLI under `exitwatch run`, with the private rootful podman (the `podman`
fixture): CONTAINER_HOST gets a socket of the run's, and what `podman --remote` makes
there (containers, pods, networks, volumes) is labelled, and goes when the run ends, or,
the wrapper SIGKILLed, when the agent reaps it; what cannot be labelled is refused with a
line the CLI shows; and the CLI's other commands answer through the proxy as they do
directly. unit/test_proxy_libpod.py has the rules alone."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from exitwatch.contract import LABEL_OWNER
from exitwatch.owner import owner_of

from support import podmancli
from support.agentproc import GONE_DEADLINE, running
from support.procs import wait_for
from support.wrapper import RUN, env_for, run

# What a runner's podman calls make, then a line, then a wait on stdin.
MAKES = r"""
podman run -d --name made -v namedvol:/data -v pre:/p $IMAGE >/dev/null
podman pod create --name madepod >/dev/null
podman run -d --pod madepod --name inpod $IMAGE >/dev/null
podman network create madenet >/dev/null
podman volume create madevol >/dev/null
podman network create --label exitwatch.keep=true keptnet >/dev/null
echo "$CONTAINER_HOST"
read x
"""


def _env(bases: Path, podman, docker_too: bool) -> dict[str, str]:
    """A caller whose CONTAINER_HOST is the podman service; its DOCKER_HOST the same
    service (one socket of the run's for both) or none (a second socket)."""
    env = env_for(bases, podman if docker_too else None, IMAGE=podman.image)
    return env | {"CONTAINER_HOST": podman.host}


def _labels(podman, what: str, *args: str) -> dict[str, dict[str, str]]:
    """name -> labels of every `what` (ps, pod ps, network ls, volume ls) on the service."""
    out = podman.podman(what, *args, "--format", "json").stdout
    name = {"ps": "Names", "pod": "Name", "network": "name", "volume": "Name"}[what]
    found = {}
    for item in json.loads(out or "[]"):
        key = item[name][0] if what == "ps" else item[name]
        found[key] = item.get("Labels") or item.get("labels") or {}
    return found


def _all(podman) -> dict[str, dict[str, dict[str, str]]]:
    return {
        "containers": _labels(podman, "ps", "-a"),
        "pods": _labels(podman, "pod", "ps"),
        "networks": _labels(podman, "network", "ls"),
        "volumes": _labels(podman, "volume", "ls"),
    }


def _owned(everything: dict[str, dict[str, dict[str, str]]]) -> dict[str, set[str]]:
    return {
        kind: {n for n, labels in items.items() if LABEL_OWNER in labels}
        for kind, items in everything.items()
    }


OWNED = {
    # The pod's infra container takes the pod's labels (its name is added: _infra).
    "containers": {"made", "inpod"},
    "pods": {"madepod"},
    "networks": {"madenet"},
    "volumes": {"namedvol", "madevol"},
}


def _start(bases: Path, podman, docker_too: bool, script: str = MAKES) -> subprocess.Popen[str]:
    """`exitwatch run -- sh -c SCRIPT`, its stdin, stdout and stderr piped."""
    return subprocess.Popen(
        [*RUN, "--", "sh", "-c", script],
        env=_env(bases, podman, docker_too),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _owned_with_infra(podman) -> dict[str, set[str]]:
    """OWNED, with the name of madepod's infra container (podman names it by the pod's id)."""
    pod = json.loads(podman.podman("pod", "inspect", "madepod").stdout)
    pod = pod[0] if isinstance(pod, list) else pod
    return OWNED | {"containers": OWNED["containers"] | {f"{pod['Id'][:12]}-infra"}}


def test_what_podman_makes_is_labelled_and_goes_with_the_run(podman, bases) -> None:
    podman.podman("volume", "create", "pre")  # the run mounts it: it stays, unlabelled
    for docker_too in (False, True):
        proc = _start(bases, podman, docker_too)
        served = proc.stdout.readline().strip()
        assert served.startswith(f"unix://{bases}/"), proc.stderr.read()
        # One socket for both where DOCKER_HOST is the same service, else one each.
        sock = "docker.sock" if docker_too else "podman.sock"
        assert served.endswith(f"/{sock}")
        owner = str(owner_of(proc.pid))
        everything = _all(podman)
        assert _owned(everything) == _owned_with_infra(podman)
        assert {
            labels[LABEL_OWNER]
            for items in everything.values()
            for labels in items.values()
            if LABEL_OWNER in labels
        } == {owner}
        assert LABEL_OWNER not in everything["networks"]["keptnet"]
        _, err = proc.communicate("\n", timeout=120)
        assert proc.returncode == 0, err
        assert "exitwatch run" not in err  # nothing it could not remove
        assert _owned(_all(podman)) == {kind: set() for kind in OWNED}
        left = _all(podman)
        assert "keptnet" in left["networks"] and left["volumes"] == {"pre": {}}
        podman.podman("network", "rm", "keptnet")
        assert list(bases.iterdir()) == []


def test_the_agent_reaps_a_sigkilled_run_s_pods_containers_networks_volumes(
    podman, workroot, tmp_path
) -> None:
    podman.podman("volume", "create", "pre")
    with running(podman, workroot, tmp_path / "agent.log") as agent:
        proc = _start(workroot, podman, docker_too=True)
        assert proc.stdout.readline().strip(), proc.stderr.read()
        assert _owned(_all(podman)) == _owned_with_infra(podman)
        agent.wait_holding(proc.pid, containers=3, workdirs=2)
        proc.kill()
        proc.wait()

        def reaped() -> bool:
            return _owned(_all(podman)) == {k: set() for k in OWNED} and not list(
                workroot.iterdir()
            )

        wait_for(reaped, timeout=GONE_DEADLINE, what="the killed run's podman resources reaped")
        assert _all(podman)["volumes"] == {"pre": {}}
        proc.stdout.close()
        proc.stderr.close()


def test_kube_play_is_refused_with_a_line_the_cli_shows(podman, bases, tmp_path) -> None:
    kube = tmp_path / "pod.yaml"
    kube.write_text(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: kubepod\nspec:\n  containers:\n"
        f"  - name: c\n    image: {podman.image}\n"
    )
    for verb in (["kube", "play"], ["play", "kube"]):
        done = run(["--", "podman", *verb, str(kube)], _env(bases, podman, docker_too=True))
        assert done.returncode == 125, done.stderr
        assert "Error: exitwatch: podman kube play is refused here" in done.stderr
        assert _all(podman)["pods"] == {}
        assert "kubepod-c" not in _all(podman)["containers"]


def test_the_podman_cli_answers_through_the_run_as_directly(podman, bases) -> None:
    env = _env(bases, podman, docker_too=False) | podmancli.fixed(podman)
    direct = subprocess.run(
        ["sh", "-c", podmancli.SAME], env=env, capture_output=True, text=True, timeout=120
    )
    proxied = run(["--", "sh", "-c", podmancli.SAME], env)
    podmancli.assert_same(direct, proxied)


def test_a_pod_that_holds_a_live_owner_s_container_stays_whole(podman, bases) -> None:
    live = str(owner_of())  # this test's process: alive
    script = (
        "podman pod create --name shared >/dev/null && podman run -d --pod shared --name mine "
        "$IMAGE >/dev/null && echo made && read x"
    )
    proc = _start(bases, podman, True, script)
    assert proc.stdout.readline() == "made\n", proc.stderr.read()
    # Another owner's container, alive, joins the run's pod directly.
    podman.podman("run", "-d", "--pod", "shared", "--name", "theirs", "--label",
                  f"{LABEL_OWNER}={live}", podman.image)  # fmt: skip
    _, err = proc.communicate("\n", timeout=120)
    assert proc.returncode == 0, err
    said = [line for line in err.splitlines() if "left in place" in line]
    why = f"it holds container theirs of live owner {live}"
    assert f"exitwatch run: pod shared left in place: {why}" in said, err
    assert any(f"left in place: the infra container of pod shared: {why}" in s for s in said)
    left = _all(podman)
    # The run's own container went; the pod, its infra container and theirs stay.
    assert "mine" not in left["containers"] and "theirs" in left["containers"]
    assert set(left["pods"]) == {"shared"} and len(left["containers"]) == 2


def test_a_podman_build_s_failed_step_leaves_no_container_through_the_run(
    podman, bases, tmp_path
) -> None:
    (tmp_path / "Dockerfile").write_text(f"FROM {podman.image}\nRUN false\n")
    build = ["podman", "build", "--rm=false", "--force-rm=false", str(tmp_path)]

    def working() -> list[str]:  # buildah's containers: podman lists them as external
        out = podman.podman("ps", "-a", "--external", "--format", "{{.ID}} {{.Names}}").stdout
        return [line for line in out.splitlines() if "working-container" in line]

    env = _env(bases, podman, docker_too=False)
    direct = subprocess.run(build, env=env, capture_output=True, text=True, timeout=120)
    assert direct.returncode != 0 and 'STEP "RUN false"' in direct.stderr, direct.stderr
    left = working()
    assert len(left) == 1, left  # kept, as asked: directly, nobody's
    podman.podman("rm", "-f", left[0].split()[0])
    proxied = run(["--", *build], env)
    assert proxied.returncode == direct.returncode, proxied.stderr
    assert 'STEP "RUN false"' in proxied.stderr
    assert working() == []  # forcerm=1, whatever the client asked


# Creations under version prefixes that podman reads and moby would not ([0-9A-Za-z.-]).
ODD_PREFIXES = r"""
sock=${CONTAINER_HOST#unix://}
curl -sf --unix-socket "$sock" -H 'Content-Type: application/json' \
    -d "{\"Image\": \"$IMAGE\"}" 'http://d/v1.41-x/containers/create?name=odd-docker' >/dev/null
curl -sf --unix-socket "$sock" -H 'Content-Type: application/json' \
    -d "{\"image\": \"$IMAGE\", \"name\": \"odd-libpod\"}" \
    'http://d/v4.3.1-dev/libpod/containers/create' >/dev/null
echo "$EXITWATCH_OWNER"
read x
"""


def test_creations_under_podman_s_wider_version_prefixes_are_labelled(podman, bases) -> None:
    proc = _start(bases, podman, True, ODD_PREFIXES)
    owner = proc.stdout.readline().strip()
    containers = _all(podman)["containers"]
    _, err = proc.communicate("\n", timeout=120)
    assert owner and proc.returncode == 0, err
    assert {n: c.get(LABEL_OWNER) for n, c in containers.items()} == {
        "odd-docker": owner,
        "odd-libpod": owner,
    }


def test_a_restore_passes_in_place_and_is_refused_from_an_archive(podman, bases, tmp_path) -> None:
    # No checkpoint can be made here (criu fails under the suite's runc): a restore of a
    # running container is the engine's refusal, the same directly and through the run.
    podman.podman("run", "-d", "--name", "ck", podman.image)
    env = _env(bases, podman, docker_too=False)
    restore = ["podman", "container", "restore", "ck"]
    direct = subprocess.run(restore, env=env, capture_output=True, text=True, timeout=120)
    proxied = run(["--", *restore], env)
    assert "cannot restore" in direct.stderr and direct.returncode != 0, direct.stderr
    assert (proxied.returncode, proxied.stderr) == (direct.returncode, direct.stderr)
    archive = tmp_path / "ck.tar"
    archive.write_bytes(b"")
    done = run(["--", "podman", "container", "restore", "--import", str(archive)], env)
    assert done.returncode != 0
    assert "Error: exitwatch: podman container restore --import is refused here" in done.stderr
