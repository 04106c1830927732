"""`exitwatch run` as a user runs it: real commands, real signals, a real pty, and a real
unprivileged user. engine/test_run_engine.py runs it with the private engine,
unit/test_run_cli.py has its refusals of bad use."""

from __future__ import annotations

import json
import os
import pty
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import termios
import time
from pathlib import Path

import pytest

from exitwatch.owner import owner_of

from support.procs import wait_for
from support.wrapper import REPO, RUN, env_for, run


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


# -- exit status -------------------------------------------------------------------------------


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


# None of the children below waits in signal.pause() or a plain read(): a signal that lands
# after the interpreter last looked for one and before it blocks there is handled only once
# the call returns, so the handler would wait for another signal or the next line, with or
# without the wrapper. Each waits on `wake` too, which the signal itself makes readable.
def waking(program: str) -> str:
    """`program`, after a prelude that gives it `os`, `signal` and `wake`."""
    prelude = r"""
import os, signal
wake, woken = os.pipe()
os.set_blocking(woken, False)
signal.set_wakeup_fd(woken)
"""
    return prelude + program


# Reports each signal it gets; exits 10+N on the one it was told to exit on.
# The children write with os.write, not print: a handler that prints while the main code is
# inside print's buffered write fails with "reentrant call" (seen on Python 3.13, when the
# test's signal came as soon as "ready" reached the pipe).
CATCHER = waking(r"""
import sys
stop = int(sys.argv[1])
def on(n, _):
    os.write(1, f"{signal.Signals(n).name}\n".encode())
    if n == stop:
        sys.exit(10 + n)
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
    signal.signal(s, on)
os.write(1, b"ready\n")
while True:
    os.read(wake, 4096)
""")


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
COUNTER = waking(r"""
import select
n = 0
def on(*_):
    global n
    n += 1
    os.write(1, f"INT {n}\n".encode())
signal.signal(signal.SIGINT, on)
os.write(1, b"ready\n")
typed = b""
while b"quit" not in typed:
    if 0 in select.select([0, wake], [], [])[0]:
        line = os.read(0, 4096)
        if not line:  # the terminal hung up
            break
        typed += line
    else:
        os.read(wake, 4096)
os.write(1, f"total {n}\n".encode())
""")


def _in_a_pty(argv: list[str], env: dict[str, str]) -> tuple[int, str]:
    """Press Ctrl-C twice in a terminal, then type quit: (exit status, what was shown)."""
    pid, fd = pty.fork()
    if pid == 0:  # pragma: no cover - the child execs at once
        os.execve(argv[0], argv, env)
    # A ^C flushes what the terminal holds for its reader, and the kernel sends the signal
    # before it flushes: a handler quick to print on the other core loses its line, with or
    # without the wrapper. NOFLSH keeps it; the signal and who gets it are as before.
    attrs = termios.tcgetattr(fd)
    attrs[3] |= termios.NOFLSH
    termios.tcsetattr(fd, termios.TCSANOW, attrs)
    shown = ""

    def until(text: str) -> None:
        nonlocal shown
        deadline = time.monotonic() + 60
        while text not in shown:
            left = deadline - time.monotonic()
            if not (left > 0 and select.select([fd], [], [], left)[0]):
                raise AssertionError(f"no {text!r} in {shown!r}; the child: {_signals(pid)}")
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


def _signals(pid: int) -> str:
    """What the kernel holds of `pid`'s and its children's state and signals (under the
    wrapper, the handler is a child's): why a ^C brought no line."""
    keep = ("State", "SigQ", "SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt")
    try:
        with open(f"/proc/{pid}/status") as f:
            said = "; ".join(line.strip() for line in f if line.startswith(keep))
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            children = f.read().split()
    except OSError as err:
        return f"/proc/{pid}: {err.strerror}"
    return " | ".join([f"{pid}: {said}", *(_signals(int(child)) for child in children)])


def test_ctrl_c_in_a_terminal_is_as_without_the_wrapper(bases) -> None:
    cmd = [sys.executable, "-c", COUNTER]
    direct = _in_a_pty(cmd, env_for(bases))
    wrapped = _in_a_pty([*RUN, "--", *cmd], env_for(bases))
    assert direct[0] == wrapped[0] == 0
    assert "total 2" in direct[1] and "total 2" in wrapped[1], wrapped[1]


# -- what CMD leaves ---------------------------------------------------------------------------

# CMD waits for both leftovers to have said their pids. A missing file counts as none:
# `wc -l < FILE` of a file not made yet failed the test (`[ "" -lt 2 ]` is false, so CMD
# ended before the leftovers had written, and the wrapper's cleanup ended them first).
LEFTOVERS = r"""
setsid sh -c 'trap "echo termed >> $1; exit 0" TERM; echo $$ >> $2
               while :; do sleep 0.05; done' sh "$1" "$2" &
setsid sh -c 'trap "" TERM; echo $$ >> $2; exec sleep 1000' sh "$1" "$2" &
while [ "$(cat "$2" 2>/dev/null | wc -l)" -lt 2 ]; do sleep 0.05; done
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


# Ignores SIGTERM, says when it came (CLOCK_MONOTONIC is the host's, as the test's), and
# stays; its parent, CMD, exits once the leftover has said its pid (its handler set) and
# the test has said go (it holds a pidfd of the leftover by then).
STUBBORN = waking(r"""
import sys, time
ready = os.pipe()
if os.fork():
    os.read(ready[0], 1)
    while not os.path.exists(sys.argv[3]):
        time.sleep(0.01)
    sys.exit(0)
os.setsid()
def on(*_):
    with open(sys.argv[1], "a") as f:
        f.write(f"{time.monotonic()}\n")
signal.signal(signal.SIGTERM, on)
with open(sys.argv[2], "w") as f:
    f.write(str(os.getpid()))
os.write(ready[1], b"x")
while True:
    os.read(wake, 4096)
""")


@pytest.mark.parametrize("grace", [0.5, 2.0])
def test_grace_is_the_time_from_sigterm_to_sigkill(bases, tmp_path, grace) -> None:
    termed, said, go = tmp_path / "termed", tmp_path / "pid", tmp_path / "go"
    cmd = [sys.executable, "-c", STUBBORN, str(termed), str(said), str(go)]
    argv = [*RUN, "--grace", str(grace), "--", *cmd]
    with subprocess.Popen(argv, env=env_for(bases), stderr=subprocess.PIPE, text=True) as wrapper:
        # The leftover's end, seen through a pidfd: the wrapper's own cleanup afterwards,
        # slow on a busy machine, is not the grace.
        leftover = os.pidfd_open(int(wait_for(lambda: said.exists() and said.read_text())))
        go.touch()
        try:
            assert select.select([leftover], [], [], 60)[0], "the leftover outlived 60 s"
            killed = time.monotonic()
        finally:
            os.close(leftover)
        assert wrapper.wait(timeout=60) == 0, wrapper.stderr.read()
    waited = killed - float(termed.read_text())
    # Not before the grace (but for how late the handler may run after the SIGTERM); and
    # well before 5 s, the default, whatever the grace given.
    assert grace - 0.25 <= waited < grace + 2.5, waited


def test_what_a_run_left_in_place_is_named_on_stderr(bases, tmp_path) -> None:
    # CMD puts a workdir of another owner, alive (this test), inside its TMPDIR.
    script = (
        f'mkdir "$TMPDIR/theirs" && {sys.executable} -m exitwatch mark --pid {os.getpid()} '
        '"$TMPDIR/theirs" && echo "$TMPDIR"'
    )
    done = run(["--", "sh", "-c", script], env_for(bases))
    assert done.returncode == 0, done.stderr
    tmpdir = Path(done.stdout.strip())
    assert done.stderr == (
        f"exitwatch run: workdir {tmpdir} left in place: left 1 entries: theirs: it is the "
        f"workdir of another owner, {owner_of()}, who is alive\n"
    )
    assert (tmpdir / "theirs" / ".exitwatch-owner").exists()
    shutil.rmtree(tmpdir)


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


# -- as an unprivileged caller -----------------------------------------------------------------


def test_an_unprivileged_caller_cleans_up_with_its_own_rights(attacker, tmp_path) -> None:
    top = Path(tempfile.mkdtemp(prefix="exitwatch-user-"))
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
