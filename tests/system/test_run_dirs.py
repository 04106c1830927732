"""Where `exitwatch run` puts its socket's directory and CMD's TMPDIR when XDG_RUNTIME_DIR and
TMPDIR name directories that another user, the real unprivileged `exitwatch-test`, could
rename or replace things in: root's run uses /tmp instead and says why, one line; the
user's run of the user's own directories uses them. engine/test_run_dirs_hijack.py has the
attack raced against root's run with the engine; unit/test_run_dirs_fd.py the rule's
details."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.users import SYSTEM_PYTHON, setpriv_argv
from support.wrapper import REPO, env_for, run

SHOW = 'echo "$DOCKER_HOST" "$TMPDIR"; touch "$TMPDIR/result.txt"'


@pytest.fixture
def top() -> Iterator[Path]:
    """A root-owned directory under /tmp that the layouts are built in."""
    top = Path(tempfile.mkdtemp(prefix="exitwatch-dirs-"))
    os.chmod(top, 0o755)
    yield top
    shutil.rmtree(top)


def _users(attacker, path: Path, mode: int = 0o755) -> Path:
    path.mkdir(mode=mode)
    os.chown(path, attacker.pw_uid, attacker.pw_gid)
    return path


def _roots(path: Path, mode: int = 0o700, gid: int = 0) -> Path:
    path.mkdir()
    os.chown(path, 0, gid)
    path.chmod(mode)
    return path


def _layout(name: str, top: Path, attacker) -> tuple[Path, str]:
    """The base of the layout `name`, and the one directory on its path that makes it
    unsafe with why, as the note says it."""
    who = f"uid {attacker.pw_uid} ({attacker.pw_name})"
    if name == "a user's directory":
        base = _users(attacker, top / "u")
        return base, f"{base} is owned by {who}"
    if name == "root's directory in a user's":
        users = _users(attacker, top / "u")
        return _roots(users / "run"), f"{users} is owned by {who}"
    if name == "root's, writable by a user's group":
        base = _roots(top / "g", 0o770, attacker.pw_gid)
        return base, f"{base} is writable by its group or others and not sticky (mode 0770)"
    if name == "root's, writable by all, not sticky":
        shared = _roots(top / "w", 0o777)
        return _roots(shared / "run"), (
            f"{shared} is writable by its group or others and not sticky (mode 0777)"
        )
    if name == "a user's symlink to root's directory":
        link = top / "link"
        link.symlink_to(_roots(top / "r"))
        os.lchown(link, attacker.pw_uid, attacker.pw_gid)
        return link, f"{link} is a symlink of {who}"
    assert name == "root's symlink into a user's directory"
    users = _users(attacker, top / "u")
    (top / "link").symlink_to(_roots(users / "run"))
    return top / "link", f"{users} is owned by {who}"


@pytest.mark.parametrize(
    "layout",
    [
        "a user's directory",
        "root's directory in a user's",
        "root's, writable by a user's group",
        "root's, writable by all, not sticky",
        "a user's symlink to root's directory",
        "root's symlink into a user's directory",
    ],
)
def test_roots_run_does_not_use_a_base_another_user_could_swap_in(top, attacker, layout):
    base, why = _layout(layout, top, attacker)
    before = sorted(p.relative_to(top) for p in top.rglob("*"))
    done = run(["--", "sh", "-c", SHOW], env_for(base))
    assert done.returncode == 0, done.stderr
    assert done.stderr == (
        f"exitwatch run: not using {base} (XDG_RUNTIME_DIR and TMPDIR): {why}, so another "
        "user could rename or replace what the run makes there; using /tmp\n"
    )
    host, tmpdir = done.stdout.split()
    sock_dir = Path(host.removeprefix("unix://")).parent
    assert sock_dir.parent == Path(tmpdir).parent == Path("/tmp")
    assert not sock_dir.exists() and not Path(tmpdir).exists()
    assert sorted(p.relative_to(top) for p in top.rglob("*")) == before  # nothing made there


@pytest.mark.parametrize("layout", ["root's directory in a sticky shared one", "root's symlink"])
def test_roots_run_uses_a_base_only_root_can_swap_in(top, layout):
    if layout == "root's symlink":
        (top / "link").symlink_to(_roots(top / "r"))
        base, real = top / "link", top / "r"
    else:
        base = real = _roots(_roots(top / "s", 0o1777) / "run")
    done = run(["--", "sh", "-c", SHOW], env_for(base))
    assert (done.returncode, done.stderr) == (0, "")
    host, tmpdir = done.stdout.split()
    # The path handed to CMD is the resolved one: no symlink in it to change later.
    assert Path(host.removeprefix("unix://")).parent.parent == Path(tmpdir).parent == real
    assert list(real.iterdir()) == []


def test_a_users_run_uses_the_users_own_directories(top, attacker, tmp_path):
    users = _users(attacker, top / "u")
    runtime = _users(attacker, users / "run", 0o700)
    env = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": str(REPO),
        "TMPDIR": str(users),
        "XDG_RUNTIME_DIR": str(runtime),
        "DOCKER_HOST": f"unix://{tmp_path}/none.sock",
    }
    argv = setpriv_argv(attacker, SYSTEM_PYTHON, "-m", "exitwatch", "run", "--", "sh", "-c", SHOW)
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    host, tmpdir = done.stdout.split()
    assert Path(host.removeprefix("unix://")).parent.parent == runtime
    assert Path(tmpdir).parent == users
    assert sorted(users.rglob("*")) == [runtime]


# CMD connects to its socket (the engine there is missing: the connection is closed at once)
# and writes in its TMPDIR; under a umask of 0777 the socket, the directories and their
# markers would be 0000 to their own user.
_CONNECT = (
    'python3 -I -S -c "import socket, sys; socket.socket(socket.AF_UNIX).connect(sys.argv[1])"'
    ' "${DOCKER_HOST#unix://}" && echo connected; touch "$TMPDIR/f" && echo wrote'
)


def test_a_users_run_under_a_umask_of_0777_starts_and_leaves_nothing(top, attacker, tmp_path):
    users = _users(attacker, top / "u")
    runtime = _users(attacker, users / "run", 0o700)
    env = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": str(REPO),
        "TMPDIR": str(users),
        "XDG_RUNTIME_DIR": str(runtime),
        "DOCKER_HOST": f"unix://{tmp_path}/none.sock",
    }
    run_argv = [SYSTEM_PYTHON, "-m", "exitwatch", "run", "--", "sh", "-c", _CONNECT]
    argv = setpriv_argv(attacker, "sh", "-c", 'umask 0777; exec "$@"', "sh", *run_argv)
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stderr, done.stdout) == (0, "", "connected\nwrote\n")
    assert sorted(users.rglob("*")) == [runtime]  # its directories gone, none 0000 left


def test_a_tmpdir_that_is_gone_is_passed_over_for_tmp_and_said(tmp_path):
    gone = tmp_path / "gone"
    env = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": str(REPO),
        "TMPDIR": str(gone),
        "DOCKER_HOST": f"unix://{tmp_path}/none.sock",
    }
    argv = [SYSTEM_PYTHON, "-m", "exitwatch", "run", "--", "sh", "-c", 'echo "$TMPDIR"']
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).parent == Path("/tmp")
    assert done.stderr == (
        f"exitwatch run: not using {gone} (TMPDIR): No such file or directory; using /tmp\n"
    )
