"""The run's directories (run/dirs.py, the rule proxy/safedir.py's) as any user can try
them: the rule on modes and symlinks, the choice of bases, and that the socket, the marker
and the removal go through the descriptors held, whatever is renamed meanwhile.
system/test_run_dirs.py has the rule against another user's directories;
engine/test_run_dirs_hijack.py the attack on a run."""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path

import pytest

from exitwatch.contract import MARKER, mark_workdir
from exitwatch.owner import owner_of
from exitwatch.proxy import safedir
from exitwatch.proxy.server import listen
from exitwatch.run import dirs

OWNER = owner_of()


@pytest.fixture
def base(bases: Path):
    # Short: tmp_path, with the run's "exitwatch-run-XXXXXXXX/docker.sock" below, comes
    # within a few bytes of sun_path's 108.
    b = safedir.open_base(str(bases))
    yield b
    b.close()


def _opened(path: Path) -> str:
    b = safedir.open_base(str(path))
    b.close()
    return b.path


# -- the rule -------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757])
def test_a_directory_others_may_write_to_without_the_sticky_bit_is_unsafe(tmp_path, mode):
    shared = tmp_path / "shared"
    (shared / "mine").mkdir(parents=True)
    shared.chmod(mode)
    for path in (shared, shared / "mine"):  # itself, or any directory above
        with pytest.raises(safedir.Unsafe) as why:
            safedir.open_base(str(path))
        assert str(why.value) == (
            f"{shared} is writable by its group or others and not sticky (mode {mode:04o})"
        )


def test_a_sticky_shared_directory_is_safe_as_tmp_is(tmp_path):
    shared = tmp_path / "shared"
    (shared / "mine").mkdir(parents=True)
    shared.chmod(0o1777)
    assert _opened(shared / "mine") == str(shared / "mine")


def test_symlinks_dot_and_dotdot_resolve_to_a_path_without_them(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "rel").symlink_to("a/b/..")
    (tmp_path / "abs").symlink_to(tmp_path / "rel")
    assert _opened(tmp_path / "abs" / "." / "b") == str(tmp_path / "a" / "b")
    assert _opened(Path("/../..") / str(tmp_path).lstrip("/")) == str(tmp_path)


def test_a_symlink_loop_or_a_file_is_an_oserror(tmp_path):
    (tmp_path / "loop").symlink_to("loop")
    (tmp_path / "file").write_text("")
    with pytest.raises(OSError) as err:
        safedir.open_base(str(tmp_path / "loop"))
    assert err.value.errno == errno.ELOOP
    with pytest.raises(NotADirectoryError):
        safedir.open_base(str(tmp_path / "file"))


# -- the choice of bases --------------------------------------------------------------------


def test_one_note_per_directory_not_used_naming_its_variables(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    got = dirs.pick({"XDG_RUNTIME_DIR": str(shared), "TMPDIR": str(shared)}, tmpdir=True)
    got.close()
    assert got.socket is got.tmpdir and got.socket.path == "/tmp"
    assert got.notes == [
        f"not using {shared} (XDG_RUNTIME_DIR and TMPDIR): {shared} is writable by its group "
        "or others and not sticky (mode 0777), so another user could rename or replace what "
        "the run makes there; using /tmp"
    ]


def test_tmpdir_alone_refused_and_an_unusable_xdg_runtime_dir_passed_over(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o770)
    long = tmp_path / ("x" * dirs.SOCKET_BASE_MAX)
    long.mkdir()
    for xdg in ("", "relative", str(tmp_path / "none"), str(long)):
        got = dirs.pick({"XDG_RUNTIME_DIR": xdg, "TMPDIR": str(shared)}, tmpdir=True)
        got.close()
        assert (got.socket.path, got.tmpdir.path) == ("/tmp", "/tmp")
        assert len(got.notes) == 1 and got.notes[0].startswith(f"not using {shared} (TMPDIR): ")


def test_the_callers_own_directories_are_used_and_no_tmpdir_is_no_tmpdir(bases):
    (bases / "run").mkdir(mode=0o700)  # short enough for the socket's
    env = {"XDG_RUNTIME_DIR": str(bases / "run"), "TMPDIR": str(bases)}
    got = dirs.pick(env, tmpdir=True)
    got.close()
    assert (got.socket.path, got.tmpdir.path, got.notes) == (
        env["XDG_RUNTIME_DIR"],
        env["TMPDIR"],
        [],
    )
    got = dirs.pick(env, tmpdir=False)
    got.close()
    assert got.tmpdir is None and got.socket.path == env["XDG_RUNTIME_DIR"]


def test_a_tmpdir_that_is_not_there_is_passed_over_for_tmp(tmp_path):
    # Whoever can remove root's TMPDIR, or put a file in its place, must not be able to
    # stop root's run from starting (the second review's F9): /tmp it is, said in one line.
    bases = dirs.pick({"TMPDIR": str(tmp_path / "none")}, tmpdir=True)
    try:
        assert bases.tmpdir is not None and bases.tmpdir.path == "/tmp"
        assert bases.notes == [
            f"not using {tmp_path / 'none'} (TMPDIR): No such file or directory; using /tmp"
        ]
    finally:
        bases.close()


# -- through the descriptors ----------------------------------------------------------------


def test_made_is_a_fresh_marked_0700_directory_and_removal_takes_it_whole(base):
    made = dirs.make(base, OWNER)
    path = Path(made.path)
    assert path.parent == Path(base.path) and path.name.startswith(dirs.PREFIX)
    assert stat.S_IMODE(path.stat().st_mode) == 0o700
    assert json.loads((path / MARKER).read_text()) == {"owner": str(OWNER)}
    (path / "a" / "b").mkdir(parents=True)
    (path / "a" / "b" / "f").write_text("x")
    outcome = dirs.remove(made, OWNER)
    assert (outcome.ok, outcome.detail) == (True, "removed")
    assert not path.exists()


def test_the_socket_lands_in_the_held_directory_after_a_swap(base):
    made = dirs.make(base, OWNER)
    moved = Path(base.path, "moved")
    os.rename(made.path, moved)
    os.mkdir(made.path)  # what a swap between the check and the bind puts there
    listener = listen(made.path, dir_fd=made.fd)
    try:
        assert stat.S_ISSOCK((moved / "docker.sock").lstat().st_mode)
        assert not Path(made.path, "docker.sock").exists()
    finally:
        listener.close()
        os.close(made.fd)
        os.close(made.parent)


def test_removal_refuses_a_directory_put_in_place_of_the_one_made(base):
    made = dirs.make(base, OWNER)
    moved = Path(base.path, "moved")
    os.rename(made.path, moved)
    os.mkdir(made.path)
    mark_workdir(made.path)  # marked alike, even
    outcome = dirs.remove(made, OWNER)
    assert (outcome.ok, outcome.refused) == (False, True)
    assert outcome.detail == "another directory was put in its place"
    assert (Path(made.path) / MARKER).exists() and (moved / MARKER).exists()


def test_removal_refuses_the_one_made_moved_elsewhere(base):
    made = dirs.make(base, OWNER)
    os.rename(made.path, Path(base.path, "moved"))
    outcome = dirs.remove(made, OWNER)
    assert (outcome.ok, outcome.detail) == (False, "it was moved elsewhere")
    assert (Path(base.path, "moved") / MARKER).exists()


def test_removal_of_one_removed_already_is_done(base):
    made = dirs.make(base, OWNER)
    os.unlink(Path(made.path, MARKER))
    os.rmdir(made.path)
    outcome = dirs.remove(made, OWNER)
    assert (outcome.ok, outcome.detail) == (True, "already gone")
