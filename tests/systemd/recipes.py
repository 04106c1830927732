"""exitwatch-adopt under systemd, and docs/adopt.md's three recipes typed as written (checks.py).

Each recipe's files and commands are read from docs/adopt.md itself (adoptdoc.py), the
files written with the page's text and its commands run as they stand. Where a recipe
names no command (Recipe 2 as written: files read by pam_env and by systemd's manager),
the ones that make a running host take them are run: `systemctl daemon-reexec` (systemd
reads system.conf.d again) and a restart of the two services, as a boot would start them.
After each recipe: is exitwatch-adopt up and answering, does the agent talk to a live
engine, and does a runner adopted the recipe's way get reaped when it dies. Each recipe is
then undone, and both services checked back, so that the next starts clean."""

from __future__ import annotations

import os
import re
import shutil

from adoptdoc import Recipe, recipe
from guest import (
    ADOPT_SOCKET,
    IMAGE,
    RUNNER_IMAGE,
    Failed,
    answers,
    container_exists,
    first_line,
    journal,
    kill,
    labels_of,
    meant_death,
    out,
    own_lines,
    read,
    running,
    sh,
    spawn,
    status,
    unit,
    within,
)

CONFIG = "/etc/exitwatch/config.toml"
PAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "adopt.md")
ADOPT = "exitwatch-adopt.service"


def docker_ok(host: str | None = None) -> bool:
    argv = ["docker"] + (["-H", host] if host else []) + ["version", "--format", "x"]
    return sh(argv, check=False, timeout=20).returncode == 0


def adopt_socket() -> str:
    sh("systemctl enable --now exitwatch-adopt.socket")  # docs/adopt.md, "Setting it up"
    if unit("exitwatch-adopt.socket", "ActiveState")["ActiveState"] != "active":
        raise Failed("exitwatch-adopt.socket is not active")
    before = unit(ADOPT, "ActiveState")["ActiveState"]
    if before != "inactive":
        raise Failed(f"{ADOPT} is {before} before any client")
    within(60, lambda: docker_ok(f"unix://{ADOPT_SOCKET}"), "docker version through the socket")
    if not running(ADOPT):
        raise Failed(f"{ADOPT} is {unit(ADOPT, 'ActiveState')['ActiveState']} after a client")
    mode = out(["stat", "-c", "%U:%G %a", ADOPT_SOCKET])
    if mode != "root:docker 660":
        raise Failed(f"the socket is {mode}")
    return f"started by its first client; {ADOPT_SOCKET} {mode}"


def adopt_working(socket_path: str = ADOPT_SOCKET) -> str:
    """exitwatch-adopt running and answering on its socket (a docker client through it)."""
    within(
        30,
        # The client first: it is what starts a socket-activated service.
        lambda: docker_ok(f"unix://{socket_path}") and running(ADOPT),
        f"{ADOPT} running and answering at {socket_path}",
        fail_fast=adopt_failing,
    )
    return f"answers at {socket_path}, MainPID {unit(ADOPT, 'MainPID')['MainPID']}"


def agent_working(engine: str | None = None) -> str:
    """The agent running and connected to a live engine (`engine`, when the recipe names it)."""
    try:
        within(
            30,
            lambda: running() and answers() and status()["docker"]["connected"],
            "the agent running and connected to its engine",
        )
    except Failed as err:
        raise Failed(f"{err}: {agent_state()}") from None
    endpoint = status()["docker"]["endpoint"]
    if engine and endpoint != engine:
        raise Failed(f"the agent talks to {endpoint}, not to the engine at {engine}")
    return f"agent's engine {endpoint}: connected"


def adopt_crash() -> str:
    """docs/adopt.md: the socket's one file serves across crashes of the service."""
    pid = int(unit(ADOPT, "MainPID")["MainPID"])
    if not pid:
        raise Failed(f"{ADOPT} has no main pid")
    meant_death(ADOPT, "KILL")
    kill(pid)
    took = within(
        30,
        lambda: (
            docker_ok(f"unix://{ADOPT_SOCKET}") and unit(ADOPT, "MainPID")["MainPID"] != str(pid)
        ),
        "a new exitwatch-adopt answering on the same socket",
        fail_fast=socket_failing,
    )
    return f"answering again {took:.1f} s after SIGKILL of {pid}"


def adopt_restart() -> str:
    """docs/adopt.md: the socket's one file serves across restarts of the service."""
    pid = unit(ADOPT, "MainPID")["MainPID"]
    sh(f"systemctl restart {ADOPT}")
    try:
        took = within(
            30,
            lambda: docker_ok(f"unix://{ADOPT_SOCKET}") and running(ADOPT),
            "exitwatch-adopt answering on its socket after the restart",
            fail_fast=socket_failing,
        )
    except Failed as err:
        seen = sh(["docker", "-H", f"unix://{ADOPT_SOCKET}", "version"], check=False, timeout=20)
        client = first_line(seen.stderr) or first_line(seen.stdout)
        # What systemd saw of the socket once the service stopped again.
        sh(f"systemctl stop {ADOPT}", check=False)
        said = " | ".join(
            [
                line
                for line in out("journalctl -b --no-pager -o cat").splitlines()
                if line.startswith("exitwatch-adopt.socket: ")
            ][-2:]
        )
        # The recipes after this one need a socket that works: a new one.
        sh(f"systemctl reset-failed exitwatch-adopt.socket {ADOPT}", check=False)
        sh("systemctl restart exitwatch-adopt.socket")
        raise Failed(f"{err}; a client: {client}; systemd: {said}") from None
    return f"MainPID {pid} -> {unit(ADOPT, 'MainPID')['MainPID']}, answering {took:.1f} s on"


def socket_failing() -> str | None:
    state = unit("exitwatch-adopt.socket", "ActiveState")["ActiveState"]
    if state != "active":
        lines = journal("", "exitwatch-adopt.socket").splitlines()[-2:]
        return f"exitwatch-adopt.socket is {state}: " + " | ".join(lines)
    return None


def both_working(socket_path: str = ADOPT_SOCKET) -> str:
    return f"{adopt_working(socket_path)}; {agent_working()}"


def adopt_failing() -> str | None:
    u = unit(ADOPT, "ActiveState", "SubState", "NRestarts")
    if u["ActiveState"] == "failed" or int(u["NRestarts"]) > 3:
        lines = own_lines(ADOPT)[-2:]
        return (
            f"{ADOPT} {u['ActiveState']}/{u['SubState']}, NRestarts {u['NRestarts']}: "
            + " | ".join(lines)
        )
    return None


def agent_state() -> str:
    try:
        d = status()["docker"]
        return f"agent's engine {d['endpoint']}: connected={d['connected']} {d.get('last_error')}"
    except (OSError, ValueError, KeyError) as err:
        return f"the agent does not answer: {err}"


def runner_in_container(name: str, mount_from: str) -> dict:
    """A runner container with the socket mounted at /var/run/docker.sock, which creates a
    sandbox next to itself, as Recipe 1 shows it."""
    sandbox = f"{name}-sandbox"
    sh(f"docker rm -f {name} {sandbox} >/dev/null 2>&1 || true")
    sh(
        f"docker run -d --name {name} --label exitwatch.adopt=owner "
        f"-v {mount_from}:/var/run/docker.sock {RUNNER_IMAGE} "
        f"sh -c 'docker run -d --name {sandbox} {IMAGE} sleep 100000 && exec sleep 100000'"
    )
    within(
        90,
        lambda: container_exists(sandbox),
        f"the runner's sandbox {sandbox} created",
        fail_fast=lambda: (
            None
            if out(f"docker inspect -f '{{{{.State.Running}}}}' {name}") == "true"
            else "the runner exited: " + out(f"docker logs {name} 2>&1 | tail -n 2")
        ),
    )
    owner = labels_of(sandbox).get("exitwatch.owner")
    if not owner:
        raise Failed(f"{sandbox} is not labelled: {labels_of(sandbox)}")
    init = out(f"docker inspect -f '{{{{.State.Pid}}}}' {name}")
    if f":{init}:" not in owner:
        raise Failed(f"owner {owner} is not the runner's init (pid {init})")
    sh(f"docker kill {name}")
    took = within(30, lambda: not container_exists(sandbox), "the sandbox removed")
    sh(f"docker rm -f {name}")
    return f"sandbox labelled with the runner's init {init}; gone {took:.2f} s after docker kill"


# -- writing a recipe's files, and taking them back ------------------------------------------


def page_recipe(number: int) -> Recipe:
    with open(PAGE) as f:
        return recipe(f.read(), number)


def write_files(r: Recipe) -> dict[str, str | None]:
    """Writes the recipe's files and returns what each was before (None: it was not there).
    /etc/environment gets the lines added; config.toml gets a fragment's top-level keys
    first (TOML puts them before any table) and its tables last; other files are written."""
    before: dict[str, str | None] = {}
    for path, text in r.files:
        if path not in before:
            before[path] = read_raw(path)
        old = read_raw(path) or ""
        if path == "/etc/environment":
            new = old + ("" if old.endswith("\n") or not old else "\n") + text
        elif path == CONFIG:
            keys, tables = split_toml(text)
            new = keys + old + ("\n" + tables if tables else "")
        else:
            new = text
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(new)
    return before


def restore(before: dict[str, str | None]) -> None:
    for path, text in before.items():
        if text is None:
            os.remove(path)
        else:
            with open(path, "w") as f:
                f.write(text)


def read_raw(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        return None


def split_toml(text: str) -> tuple[str, str]:
    lines = text.splitlines(keepends=True)
    first = next((i for i, line in enumerate(lines) if line.startswith("[")), len(lines))
    return "".join(lines[:first]), "".join(lines[first:])


def run_commands(commands: list[str]) -> None:
    for command in commands:
        sh(command)


def listen_stream(text: str | None) -> str | None:
    found = re.findall(r"^ListenStream=(\S+)", text or "", re.M)
    return found[-1] if found else None


# -- Recipe 1 ----------------------------------------------------------------------------------


def recipe1(check) -> None:
    r = page_recipe(1)
    mount = re.search(r"-v (\S+):/var/run/docker\.sock", " ".join(r.commands))
    source = mount.group(1) if mount else ADOPT_SOCKET
    check(
        f"Recipe 1: a runner container mounting {source} is reaped",
        runner_in_container,
        "runner",
        source,
    )
    check("Recipe 1: exitwatch-adopt working", adopt_working)
    check("Recipe 1: the agent working", agent_working)


# -- Recipe 2 ----------------------------------------------------------------------------------

HARNESS = """\
import os, subprocess, sys, time
d = sys.argv[2]
with open(d + "/docker-host", "w") as f:
    f.write(os.environ.get("DOCKER_HOST", ""))
with open(d + "/pid", "w") as f:
    f.write(str(os.getpid()))
argv = ["docker", "run", "-d", "--name", "rig-r2-sandbox", "IMAGE", "sleep", "100000"]
if subprocess.run(argv, timeout=60).returncode != 0:
    sys.exit("my_harness: docker run failed")
open(d + "/ready", "w").close()
time.sleep(100000)
""".replace("IMAGE", IMAGE)
# What a boot would do for the files Recipe 2 writes, when the page names no command.
# The socket is started anew and its service on its first client, as at boot: a restart of
# the service alone is a check of its own (adopt_restart).
RECIPE2_DEFAULT = ["systemctl daemon-reexec", "systemctl restart exitwatch exitwatch-adopt.socket"]


def recipe2(check) -> None:
    r = page_recipe(2)
    state: dict = {}

    def apply() -> str:
        if not r.files:
            raise Failed("docs/adopt.md's Recipe 2 has no files")
        state["before"] = write_files(r)
        commands = r.commands or RECIPE2_DEFAULT
        run_commands(commands)
        seen = out("su - alice -c 'echo $DOCKER_HOST'")
        if seen != f"unix://{ADOPT_SOCKET}":
            raise Failed(f"a login shell's DOCKER_HOST is {seen!r}")
        written = ", ".join(path for path, _ in r.files)
        return f"{written}; ran: {'; '.join(commands)}"

    check("Recipe 2: its files as written, then a restart", apply)
    check("Recipe 2: exitwatch-adopt working", adopt_working)
    check("Recipe 2: the agent working", agent_working)

    d = "/root/rig-r2"
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    with open("/root/my_harness.py", "w") as f:
        f.write(HARNESS)

    def host_runner() -> str:
        sh("docker rm -f rig-r2-sandbox rig-r2-plain >/dev/null 2>&1 || true")
        harness = spawn(f"exec su - root -c 'exec python3 -m my_harness run {d}' 2>{d}/log")
        try:
            within(
                90,
                lambda: os.path.exists(f"{d}/ready"),
                "the harness made its sandbox",
                fail_fast=lambda: harness.poll() is not None and "the harness exited",
            )
        except Failed as err:
            kill(harness.pid)
            raise Failed(f"{err}: {read_tail(d + '/log')} {adopt_failing() or ''}") from None
        pid = int(read(f"{d}/pid"))
        owner = labels_of("rig-r2-sandbox").get("exitwatch.owner", "")
        if f":{pid}:" not in owner:
            raise Failed(f"rig-r2-sandbox's owner is {owner!r}, not the harness (pid {pid})")
        # An operator's own client, which no rule matches, on the same socket.
        sh(f"su - root -c 'docker run -d --name rig-r2-plain {IMAGE} sleep 100000'")
        kill(pid)
        took = within(30, lambda: not container_exists("rig-r2-sandbox"), "the sandbox removed")
        plain = labels_of("rig-r2-plain")
        if "exitwatch.owner" in plain or not container_exists("rig-r2-plain"):
            raise Failed(f"the unmatched client's container: labels {plain}")
        sh("docker rm -f rig-r2-plain")
        harness.wait()
        return f"matched runner's sandbox gone {took:.2f} s after SIGKILL; unmatched one left"

    check("Recipe 2: a host runner a rule matches is reaped, others left", host_runner)

    def undo() -> str:
        restore(state.get("before", {}))
        sh("systemctl daemon-reexec")
        sh(f"systemctl reset-failed {ADOPT} exitwatch", check=False)
        sh("systemctl restart exitwatch exitwatch-adopt.socket")
        return both_working()

    check("Recipe 2 undone: both services back", undo)


def read_tail(path: str) -> str:
    try:
        return " | ".join(read(path).splitlines()[-3:])
    except OSError:
        return ""


# -- Recipe 3 ----------------------------------------------------------------------------------


def recipe3(check) -> None:
    r = page_recipe(3)
    engine_path = listen_stream(r.file("docker.socket.d/exitwatch.conf"))
    adopt_path = listen_stream(r.file("exitwatch-adopt.socket.d/exitwatch.conf"))
    engine = f"unix://{engine_path}"
    state: dict = {}

    def apply() -> str:
        if not (engine_path and adopt_path and r.commands):
            raise Failed(f"cannot read Recipe 3 from docs/adopt.md: {r}")
        state["before"] = write_files(r)
        run_commands(r.commands)
        within(60, lambda: docker_ok(engine), f"the engine answers at {engine}")
        within(60, lambda: docker_ok(None), "docker answers at /var/run/docker.sock")
        listen = unit("exitwatch-adopt.socket", "Listen")["Listen"]
        if adopt_path not in listen:
            raise Failed(f"exitwatch-adopt.socket listens on {listen}")
        return f"ran: {'; '.join(r.commands)}"

    check("Recipe 3: its drop-ins, config and commands as written", apply)
    check(f"Recipe 3: exitwatch-adopt working at {adopt_path}", adopt_working, adopt_path)
    check("Recipe 3: the agent working, on the engine itself", agent_working, engine)
    check(
        "Recipe 3: a runner container mounting /var/run/docker.sock is reaped",
        runner_in_container,
        "runner3",
        "/var/run/docker.sock",
    )

    def undo() -> str:
        restore(state.get("before", {}))
        sh("systemctl daemon-reload")
        sh(f"systemctl stop {ADOPT}")
        sh("systemctl restart docker.socket docker exitwatch-adopt.socket exitwatch")
        within(60, lambda: docker_ok(None), "docker answers at /var/run/docker.sock again")
        return both_working()

    check("Recipe 3 undone: both services back", undo)
