"""`exitwatch adopt` is transparent: the same comparisons as `exitwatch run`'s socket passes
(test_proxy.py, support/transparency.py: the docker CLI with attach, exec -i, logs, cp and
build, events, compose v1 and v2, the Python SDK), each made through the adopt socket and
directly, for a client in a container (the socket mounted at /var/run/docker.sock, its
runner's code and command line as they are) and for a host client that a rule matches.
Only the labels differ: the owner, and what the owner is.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from exitwatch.contract import ADOPT_OWNER, LABEL_ADOPT, LABEL_OWNER, LABEL_OWNER_NAME

from support import runners, tools
from support.adopt import PLUGINS, adopting, cli_mounts
from support.transparency import (
    CLI_OPS,
    COMPOSE_FILE,
    COMPOSE_OPS,
    COMPOSE_OUT,
    cli_context,
    events_ops,
    sh,
)

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
MARK = "exitwatch-transparent"  # on the host clients' command lines, for the rule
RULE = f"*{MARK}*"
PY = os.path.basename(sys.executable)
# support.transparency.sdk_ops in a process of its own, whose arguments carry MARK: the
# SDK's own connections, hijacks included, through either socket.
SDK = f"""
import json, sys
sys.path.insert(0, {str(TESTS)!r})
import docker
from support.transparency import sdk_ops
client = docker.DockerClient(base_url=sys.argv[1])
out = sdk_ops(client, sys.argv[2], sys.argv[3])
print(json.dumps([o.decode("latin-1") for o in out]))
"""
PYTHON_MOUNTS = [  # Debian's docker SDK and compose v1, in the python image
    "-v",
    "/usr/lib/python3/dist-packages:/usr/lib/python3/dist-packages:ro",
    "-v",
    "/usr/bin/docker-compose:/usr/bin/docker-compose:ro",
    "-v",
    f"{ROOT}:{ROOT}:ro",
]
# requests 2.32 (Debian 13) loads the CA bundle as it is imported.
CERTS = "/etc/ssl/certs"
if os.path.isdir(CERTS):
    PYTHON_MOUNTS += ["-v", f"{CERTS}:{CERTS}:ro"]


@pytest.fixture(scope="module")
def adopt(engine, tmp_path_factory):
    runners.python_image(engine.host)
    with adopting(engine, (RULE,), logs=tmp_path_factory.mktemp("adopt")) as a:
        yield a


def _in_container(
    engine, sock: Path, name: str, script: str, work: Path, *extra: str, image: str = ""
) -> str:
    """`script` run by sh in a container `name` of `image` (the test image's by default)
    whose /var/run/docker.sock is `sock`, with the static CLI as `docker` and `work`
    mounted where it is, and the `extra` options; its output."""
    argv = ["docker", "run", "--rm", "--name", name, "-v", f"{sock}:/var/run/docker.sock"]
    argv += ["--label", f"{LABEL_ADOPT}={ADOPT_OWNER}"]  # a runner container (Recipe 1)
    argv += [*cli_mounts(), "-v", f"{work}:{work}", "-w", str(work)]
    done = subprocess.run(
        [*argv, *extra, image or engine.image, "sh", "-euo", "pipefail", "-c", script],
        env=engine.env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"{name}: exit {done.returncode}: {done.stderr.strip()}"
    return done.stdout


def _exported(env: dict[str, str]) -> str:
    return "".join(f"export {k}='{v}'\n" for k, v in env.items())


def _labelled(engine, names: dict[str, str], name: str) -> None:
    """Each of `names` ({name: kind}) carries an owner and is said to be `name`'s."""
    api = engine.client.api
    for item, kind in names.items():
        info = {
            "container": lambda n: api.inspect_container(n)["Config"],
            "network": api.inspect_network,
            "volume": api.inspect_volume,
        }[kind](item)
        labels = info.get("Labels") or {}
        assert LABEL_OWNER in labels, (kind, item)
        assert labels[LABEL_OWNER_NAME].startswith(name), (kind, item, labels)
        assert MARK not in labels[LABEL_OWNER_NAME].replace(RULE, ""), labels  # no arguments


def _unlabelled(engine, *containers: str) -> None:
    for c in containers:
        assert LABEL_OWNER not in (engine.client.api.inspect_container(c)["Config"]["Labels"])


def _events(since: str) -> str:
    return events_ops(since, f"{time.time():.3f}") + "\n"


CREATED = {"cp": "container", "lp": "container", "np": "network", "vp": "volume"}


def test_the_docker_cli_in_a_container(engine, adopt, tmp_path) -> None:
    common = cli_context(engine.image, tmp_path)
    since = f"{time.time() - 1:.3f}"
    runs = {}
    for suffix, sock in (("d", engine.socket), ("p", adopt.listen)):
        script = _exported(common | {"DOCKER": "docker", "SUFFIX": suffix}) + CLI_OPS
        runs[suffix] = _in_container(engine, sock, f"cli-{suffix}", script, tmp_path)
    assert runs["p"] == runs["d"]
    assert runs["d"].startswith("hello-stdin\n") and runs["d"].endswith("in-volume\n")
    _labelled(engine, CREATED, "container cli-p")
    _unlabelled(engine, "cd", "ld")
    events = _exported({"D": "docker"}) + _events(since)
    assert _in_container(engine, adopt.listen, "ev-p", events, tmp_path) == _in_container(
        engine, engine.socket, "ev-d", events, tmp_path
    )


def test_the_docker_cli_on_the_host(engine, adopt, tmp_path) -> None:
    common = cli_context(engine.image, tmp_path)
    since = f"{time.time() - 1:.3f}"
    script = f"# {MARK}\n{CLI_OPS}"
    through = {"DOCKER_HOST": f"unix://{adopt.listen}"}
    direct = sh(script, engine.env(SUFFIX="d", DOCKER="docker", **common))
    assert sh(script, engine.env(SUFFIX="p", DOCKER="docker", **common) | through) == direct
    _labelled(engine, CREATED, f"bash (rule {RULE})")  # no argument of its own
    _unlabelled(engine, "cd", "ld")
    events = f"# {MARK}\n" + _events(since)
    env = engine.env(D="docker")
    assert sh(events, env | through) == sh(events, env)


def _compose_runs(engine, run, tmp_path: Path) -> None:
    """COMPOSE_OPS through either socket (`run(project, suffix)` gives the output), the
    outputs compared, the project's containers, networks and volumes labelled."""
    (tmp_path / "docker-compose.yml").write_text(COMPOSE_FILE.format(image=engine.image))
    assert run("pp", "p") == run("pd", "d") == COMPOSE_OUT
    api = engine.client.api
    project = {"label": "com.docker.compose.project=pp"}
    made = [
        *api.containers(all=True, filters=project),
        *api.networks(filters=project),
        *api.volumes(filters=project)["Volumes"],
    ]
    assert len(made) >= 3
    for item in made:
        assert LABEL_OWNER in (item.get("Labels") or {}), item.get("Name") or item["Names"]
    for item in api.containers(all=True, filters={"label": "com.docker.compose.project=pd"}):
        assert LABEL_OWNER not in (item.get("Labels") or {})


def test_compose_v1_and_v2_in_a_container(engine, adopt, tmp_path) -> None:
    try:
        config = tools.docker_config()
    except tools.Unavailable as err:
        pytest.skip(str(err))
    plugin = ["-v", f"{config}/cli-plugins/docker-compose:{PLUGINS}/docker-compose:ro"]
    for compose, wait, image, mounts in (
        ("docker compose", "--wait", engine.image, plugin),
        ("docker-compose", "", runners.PYTHON_IMAGE, PYTHON_MOUNTS),
    ):
        work = tmp_path / ("v2" if wait else "v1")
        work.mkdir()

        def run(
            project: str,
            suffix: str,
            compose=compose,
            wait=wait,
            image=image,
            mounts=mounts,
            work=work,
        ) -> str:
            sock = adopt.listen if suffix == "p" else engine.socket
            env = {"COMPOSE": compose, "WAIT": wait, "PROJECT": project}
            script = _exported(env) + COMPOSE_OPS
            return _in_container(engine, sock, f"co-{suffix}", script, work, *mounts, image=image)

        _compose_runs(engine, run, work)
        engine.clean()


def test_compose_v1_and_v2_on_the_host(engine, adopt, tmp_path) -> None:
    try:
        config = tools.docker_config()
    except tools.Unavailable as err:
        pytest.skip(str(err))
    for compose, wait, env in (
        ("docker compose", "--wait", {"DOCKER_CONFIG": str(config)}),
        ("docker-compose", "", {}),
    ):
        work = tmp_path / ("v2" if wait else "v1")
        work.mkdir()

        def run(project: str, suffix: str, compose=compose, wait=wait, env=env, work=work) -> str:
            base = engine.env(COMPOSE=compose, WAIT=wait, PROJECT=project, **env)
            if suffix == "p":
                base["DOCKER_HOST"] = f"unix://{adopt.listen}"
            return sh(f"# {MARK}\n{COMPOSE_OPS}", base, cwd=work)

        _compose_runs(engine, run, work)
        engine.clean()


def _sdk_compare(through: list[str], direct: list[str]) -> None:
    # The label lists differ by the owner and what it is alone.
    assert through[:-2] == direct[:-2]
    assert through[-2:] == [str(sorted([LABEL_OWNER, LABEL_OWNER_NAME]))] * 2
    assert direct[-2:] == ["[]"] * 2


def test_the_python_sdk_in_a_container(engine, adopt, tmp_path) -> None:
    outs = {}
    for suffix, sock in (("d", engine.socket), ("p", adopt.listen)):
        (tmp_path / "sdk.py").write_text(SDK)
        script = f"python3 sdk.py unix:///var/run/docker.sock {engine.image} {suffix}"
        out = _in_container(
            engine,
            sock,
            f"sdk-{suffix}",
            script,
            tmp_path,
            *PYTHON_MOUNTS,
            image=runners.PYTHON_IMAGE,
        )
        outs[suffix] = json.loads(out)
    _sdk_compare(outs["p"], outs["d"])
    _labelled(engine, {"sp": "container", "svp": "volume"}, "container sdk-p")


def test_the_python_sdk_on_the_host(engine, adopt) -> None:
    outs = {}
    for suffix, host in (("d", engine.host), ("p", f"unix://{adopt.listen}")):
        done = subprocess.run(
            [sys.executable, "-c", SDK, host, engine.image, suffix, MARK],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
        outs[suffix] = json.loads(done.stdout)
    _sdk_compare(outs["p"], outs["d"])
    _labelled(engine, {"sp": "container", "svp": "volume"}, f"{PY} (rule {RULE})")
