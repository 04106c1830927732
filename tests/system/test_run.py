"""`exitwatch run` as a user runs it: real commands, real signals, a real pty, the private
engine, and a real unprivileged user."""

from __future__ import annotations

import json
import os
import pty
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from exitwatch.contract import LABEL_OWNER
from exitwatch.owner import owner_of

from support.agentproc import GONE_DEADLINE, running
from support.procs import wait_for

REPO = Path(__file__).resolve().parents[2]
RUN = [sys.executable, "-m", "exitwatch", "run"]


@pytest.fixture
def bases() -> Iterator[Path]:
    """A short directory standing for the caller's TMPDIR and XDG_RUNTIME_DIR, so that what a
    run leaves when it is SIGKILLed lands there and goes with the test."""
    top = Path(tempfile.mkdtemp(prefix="exitwatch-runbase-", dir="/tmp"))
    yield top
    shutil.rmtree(top)


def env_for(bases: Path, engine=None, **extra: str) -> dict[str, str]:
    # Without the engine, one that is not there: cleanup then has nothing to ask.
    env = engine.env() if engine else os.environ | {"DOCKER_HOST": f"unix://{bases}/none.sock"}
    pythonpath = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return (
        env
        | {"TMPDIR": str(bases), "XDG_RUNTIME_DIR": str(bases), "PYTHONPATH": pythonpath}
        | extra
    )


def run(args: list[str], env: dict[str, str], **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run(RUN + args, env=env, capture_output=True, text=True, timeout=120, **kw)


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


# -- exit status and bad use -------------------------------------------------------------------


@pytest.mark.parametrize(("script", "code"), [("exit 0", 0), ("exit 3", 3), ("kill -9 $$", 137)])
def test_exit_status_is_cmds(bases, script, code) -> None:
    done = run(["--", "sh", "-c", script], env_for(bases))
    assert done.returncode == code, done.stderr
    assert done.stderr == ""
    assert list(bases.iterdir()) == []  # both of its directories went


def test_a_command_not_found_or_not_executable_is_127_or_126(bases, tmp_path) -> None:
    done = run(["--", str(tmp_path / "nowhere")], env_for(bases))
    assert (done.returncode, done.stderr.count("\n")) == (127, 1), done.stderr
    assert "No such file or directory" in done.stderr
    plain = tmp_path / "plain"
    plain.write_text("echo not run\n")
    done = run(["--", str(plain)], env_for(bases))
    assert (done.returncode, done.stderr.count("\n")) == (126, 1), done.stderr
    assert list(bases.iterdir()) == []


@pytest.mark.parametrize(
    "args", [[], ["--"], ["--bogus", "--", "touch", "ran"], ["--grace", "x", "--", "touch", "ran"]]
)
def test_bad_use_is_one_line_and_exit_2(bases, tmp_path, args) -> None:
    done = run(args, env_for(bases), cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("exitwatch run: "), done.stderr
    assert not (tmp_path / "ran").exists()
    assert list(bases.iterdir()) == []


def test_an_engine_that_is_not_a_unix_socket_is_refused(bases, tmp_path) -> None:
    env = env_for(bases, DOCKER_HOST="tcp://127.0.0.1:2375")
    done = run(["--", "touch", "ran"], env, cwd=tmp_path)
    assert done.returncode == 125
    assert done.stderr.count("\n") == 1 and "only an engine on a unix socket" in done.stderr
    assert not (tmp_path / "ran").exists()
    assert list(bases.iterdir()) == []


# -- what CMD is given -------------------------------------------------------------------------

SHOW_ENV = (
    'touch "$TMPDIR/scratch"; echo "$PPID $EXITWATCH_OWNER $DOCKER_HOST $TMPDIR"; '
    'cat "$TMPDIR/.exitwatch-owner"; echo'
)


def test_cmd_gets_the_runs_owner_socket_and_tmpdir(bases) -> None:
    proc = subprocess.Popen(
        [*RUN, "--", "sh", "-c", SHOW_ENV + "; read x"],
        env=env_for(bases),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    ppid, owner, host, tmpdir = proc.stdout.readline().split()
    marker = json.loads(proc.stdout.readline())
    try:
        assert int(ppid) == proc.pid and owner == str(owner_of(proc.pid)) == marker["owner"]
        socket_path = Path(host.removeprefix("unix://"))
        assert stat.S_ISSOCK(socket_path.stat().st_mode)
        assert stat.S_IMODE(socket_path.parent.stat().st_mode) == 0o700
        assert socket_path.parent.parent == bases  # XDG_RUNTIME_DIR, short
        assert Path(tmpdir).parent == bases and (Path(tmpdir) / "scratch").exists()
        assert stat.S_IMODE(Path(tmpdir).stat().st_mode) == 0o700
    finally:
        proc.communicate("\n")
    assert proc.returncode == 0
    assert not socket_path.parent.exists() and not Path(tmpdir).exists()


def test_no_tmpdir_leaves_tmpdir_alone(bases) -> None:
    done = run(["--no-tmpdir", "--", "sh", "-c", 'echo "$TMPDIR"'], env_for(bases))
    assert (done.returncode, done.stdout) == (0, f"{bases}\n")


# -- signals -----------------------------------------------------------------------------------

# Reports each signal it gets; exits 10+N on the one it was told to exit on.
CATCHER = r"""
import os, signal, sys
stop = int(sys.argv[1])
def on(n, _):
    print(signal.Signals(n).name, flush=True)
    if n == stop:
        sys.exit(10 + n)
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
    signal.signal(s, on)
print("ready", flush=True)
while True:
    signal.pause()
"""


def catcher(bases: Path, stop: int) -> subprocess.Popen:
    proc = subprocess.Popen(
        [*RUN, "--", sys.executable, "-c", CATCHER, str(stop)],
        env=env_for(bases),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline() == "ready\n"
    return proc


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT])
def test_a_signal_to_the_wrapper_is_forwarded_and_awaited(bases, sig) -> None:
    proc = catcher(bases, sig)
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=60)
    assert (proc.returncode, out) == (10 + sig, f"{sig.name}\n")


def test_a_second_sigterm_kills_cmd(bases) -> None:
    proc = catcher(bases, 0)  # exits on none
    proc.send_signal(signal.SIGTERM)
    assert proc.stdout.readline() == "SIGTERM\n"
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert (proc.returncode, out) == (128 + signal.SIGKILL, "")


# Counts SIGINTs until told to quit on stdin.
COUNTER = r"""
import signal, sys
n = 0
def on(*_):
    global n
    n += 1
    print(f"INT {n}", flush=True)
signal.signal(signal.SIGINT, on)
print("ready", flush=True)
for line in sys.stdin:
    if line.strip() == "quit":
        print(f"total {n}", flush=True)
        sys.exit(0)
"""


def _in_a_pty(argv: list[str], env: dict[str, str]) -> tuple[int, str]:
    """Press Ctrl-C twice in a terminal, then type quit: (exit status, what was shown)."""
    pid, fd = pty.fork()
    if pid == 0:  # pragma: no cover - the child execs at once
        os.execve(argv[0], argv, env)
    shown = ""

    def until(text: str) -> None:
        nonlocal shown
        deadline = time.monotonic() + 60
        while text not in shown:
            assert time.monotonic() < deadline, f"no {text!r} in {shown!r}"
            try:
                shown += os.read(fd, 4096).decode(errors="replace")
            except OSError:  # EIO: the other side closed
                break

    try:
        until("ready")
        os.write(fd, b"\x03")
        until("INT 1")
        os.write(fd, b"\x03")
        until("INT 2")
        os.write(fd, b"quit\n")
        until("total")
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(fd)
    return os.waitstatus_to_exitcode(status), shown


def test_ctrl_c_in_a_terminal_is_as_without_the_wrapper(bases) -> None:
    cmd = [sys.executable, "-c", COUNTER]
    direct = _in_a_pty(cmd, env_for(bases))
    wrapped = _in_a_pty([*RUN, "--", *cmd], env_for(bases))
    assert direct[0] == wrapped[0] == 0
    assert "total 2" in direct[1] and "total 2" in wrapped[1], wrapped[1]


# -- what CMD leaves ---------------------------------------------------------------------------

LEFTOVERS = r"""
setsid sh -c 'trap "echo termed >> $1; exit 0" TERM; echo $$ >> $2
               while :; do sleep 0.05; done' sh "$1" "$2" &
setsid sh -c 'trap "" TERM; echo $$ >> $2; exec sleep 1000' sh "$1" "$2" &
while [ "$(wc -l < "$2")" -lt 2 ]; do sleep 0.05; done
"""


def test_leftover_descendants_get_sigterm_then_sigkill(bases, tmp_path) -> None:
    said, pids = tmp_path / "said", tmp_path / "pids"
    done = run(
        ["--grace", "1", "--", "sh", "-c", LEFTOVERS, "sh", str(said), str(pids)], env_for(bases)
    )
    assert done.returncode == 0, done.stderr
    for pid in map(int, pids.read_text().split()):
        assert gone(pid), f"leftover {pid} still runs"
    assert said.read_text() == "termed\n"


def test_cmd_dies_with_the_wrapper(bases, tmp_path) -> None:
    pidfile = tmp_path / "pid"
    proc = subprocess.Popen(
        [
            *RUN,
            "--",
            "sh",
            "-c",
            f"echo $$ > {pidfile}.tmp; mv {pidfile}.tmp {pidfile}; exec sleep 1000",
        ],
        env=env_for(bases),
    )
    pid = int(wait_for(lambda: pidfile.exists() and pidfile.read_text(), what="CMD's pid"))
    proc.kill()
    proc.wait()
    wait_for(lambda: gone(pid), what=f"CMD {pid} killed by its parent's death")


# -- with the engine ---------------------------------------------------------------------------

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
    config.write_text(f'workdir_roots = ["{bases}"]\nstatus_socket = "{tmp_path}/none"\n')
    script = (
        "docker run -d --name held $IMAGE sleep 1000 >/dev/null; "
        f"{sys.executable} -m exitwatch status --json --config {config}; true"
    )
    done = run(["--", "sh", "-c", script], env_for(bases, engine, IMAGE=engine.image))
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    (entry,) = [o for o in doc["owners"] if any(c["name"] == "held" for c in o["containers"])]
    assert len(entry["workdirs"]) == 2 and all(Path(w).parent == bases for w in entry["workdirs"])


def test_an_unprivileged_caller_cleans_up_with_its_own_rights(attacker, tmp_path) -> None:
    top = Path(tempfile.mkdtemp(prefix="exitwatch-user-", dir="/tmp"))
    os.chown(top, attacker.pw_uid, attacker.pw_gid)
    script = (
        'mkdir -p "$TMPDIR/d/e" && echo x > "$TMPDIR/d/e/f" && chmod 400 "$TMPDIR/d/e/f" && '
        'ln -s /etc/passwd "$TMPDIR/link" && echo "$TMPDIR"'
    )
    env = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": str(REPO),
        "TMPDIR": str(top),
        "XDG_RUNTIME_DIR": str(top),
        "DOCKER_HOST": f"unix://{tmp_path}/none.sock",
    }
    ids = [f"--reuid={attacker.pw_uid}", f"--regid={attacker.pw_gid}", "--clear-groups"]
    try:
        done = subprocess.run(
            [
                "setpriv",
                *ids,
                "/usr/bin/python3",
                "-m",
                "exitwatch",
                "run",
                "--",
                "sh",
                "-c",
                script,
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert Path(done.stdout.strip()).parent == top
        assert list(top.iterdir()) == []
        assert Path("/etc/passwd").exists()
    finally:
        shutil.rmtree(top)


MAKES_AND_WAITS = r"""
docker run -d --name made $IMAGE sleep 1000 >/dev/null
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
    with running(engine, workroot, tmp_path / "agent.log") as agent:
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


def test_a_tmpdir_that_cannot_hold_the_runs_directory_is_one_line(bases, tmp_path) -> None:
    done = run(["--", "touch", "ran"], env_for(bases, TMPDIR=str(tmp_path / "none")), cwd=tmp_path)
    assert done.returncode == 125
    where = tmp_path / "none"
    assert done.stderr == f"exitwatch run: cannot make the run's directory in {where}: " + (
        "No such file or directory\n"
    )
    assert not (tmp_path / "ran").exists()
    assert list(bases.iterdir()) == []  # the socket's directory, made first, went too


def test_everything_goes_after_a_sigterm_to_the_wrapper(engine, bases) -> None:
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
    assert list(bases.iterdir()) == []
