"""The checks a hook and its spool must pass (contract.py's hook_problem, spool_problem
and open_spool, kinds/spool/entry.py's read_entry and spool_fd), on decoded bodies, on
stats, and on files of the test's own in a directory of its own, as any user.
system/test_hook_files.py has the same on root's real spool, with other users and mounts."""

from __future__ import annotations

import errno
import json
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from exitwatch.contract import (
    ENV_HOOK_DIR,
    HOOK_FILE,
    HOOK_MAX_BYTES,
    HOOK_MAX_TIMEOUT,
    JSON_MAX_DEPTH,
    cancel_hook,
    hook_problem,
    on_death,
    open_spool,
    spool_problem,
)
from exitwatch.kinds.hooks.kind import FORMAT, KIND
from exitwatch.kinds.spool.entry import EntryError, read_entry, spool_fd
from exitwatch.owner import owner_of

OWNER = str(owner_of())
TAMPER = "; others could tamper with hooks"


def good(**over: object) -> dict:
    """A hook body as on_death writes one, with `over` replacing its fields."""
    return {
        "owner": OWNER,
        "argv": ["curl", "-X", "DELETE", "http://127.0.0.1/sandboxes/1"],
        "cwd": "/tmp",
        "env": {"TOKEN": "s3cret"},
        "timeout": 60.0,
        "created": time.time(),
    } | over


def dir_stat(uid: int, mode: int) -> os.stat_result:
    return os.stat_result((stat.S_IFDIR | mode, 0, 0, 2, uid, uid, 0, 0, 0, 0))


# -- hook_problem: the shape of a body -----------------------------------------------------------


def test_a_good_body_has_no_problem():
    assert hook_problem(good()) is None
    assert hook_problem(good(cwd="")) is None  # "": HOME, the directory was gone
    assert hook_problem(good(env={})) is None
    assert hook_problem(good(timeout=HOOK_MAX_TIMEOUT, created=0)) is None
    assert hook_problem(good(timeout=1)) is None  # an int is a number too


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ([], "it is not a JSON object"),
        ("hook", "it is not a JSON object"),
        (None, "it is not a JSON object"),
        ({k: v for k, v in good().items() if k not in ("argv", "cwd")}, "it lacks argv, cwd"),
        (good(extra=1, also=2), "it has unknown keys ['also', 'extra']"),
        (good(owner=7), '"owner" is not a string'),
        (good(argv=[]), '"argv" is not a non-empty list of strings'),
        (good(argv="true"), '"argv" is not a non-empty list of strings'),
        (good(argv=["true", 1]), '"argv" is not a non-empty list of strings'),
        (good(argv=[""]), '"argv" has an empty command or a NUL character'),
        (good(argv=["true", "a\0b"]), '"argv" has an empty command or a NUL character'),
        (good(cwd="relative/dir"), '"cwd" is not an absolute path or ""'),
        (good(cwd="/tmp\0x"), '"cwd" is not an absolute path or ""'),
        (good(cwd=None), '"cwd" is not an absolute path or ""'),
        (good(env=[]), '"env" is not an object of NAME: "value" strings'),
        (good(env={"1BAD": "x"}), '"env" is not an object of NAME: "value" strings'),
        (good(env={"A-B": "x"}), '"env" is not an object of NAME: "value" strings'),
        (good(env={"X": 1}), '"env" is not an object of NAME: "value" strings'),
        (good(env={"X": "a\0b"}), '"env" is not an object of NAME: "value" strings'),
        (good(timeout=True), '"timeout" is not a number'),
        (good(timeout="60"), '"timeout" is not a number'),
        (good(timeout=0), f'"timeout" is not in (0, {HOOK_MAX_TIMEOUT:g}] seconds'),
        (good(timeout=-1), f'"timeout" is not in (0, {HOOK_MAX_TIMEOUT:g}] seconds'),
        (
            good(timeout=HOOK_MAX_TIMEOUT + 0.5),
            f'"timeout" is not in (0, {HOOK_MAX_TIMEOUT:g}] seconds',
        ),
        (good(created=False), '"created" is not a number'),
        (good(created="now"), '"created" is not a number'),
        (
            good(argv=["true", "\ud800"]),
            "it has a string that is not valid UTF-8 (a lone surrogate)",
        ),
        (good(env={"X": "\udfff"}), "it has a string that is not valid UTF-8 (a lone surrogate)"),
        (good(cwd="/\ud800"), "it has a string that is not valid UTF-8 (a lone surrogate)"),
        (good(owner="\ud800"), "it has a string that is not valid UTF-8 (a lone surrogate)"),
    ],
)
def test_a_bad_body_says_what_is_wrong_with_it(body, why):
    assert hook_problem(body) == why


def test_a_long_list_of_unknown_keys_is_cut_short():
    why = hook_problem(good(**{f"key_{n:03d}": n for n in range(100)}))
    assert why is not None and why.startswith("it has unknown keys ['key_000'")
    assert len(why) <= len("it has unknown keys ") + 100


# -- spool_problem: who could tamper with the spool ----------------------------------------------


@pytest.mark.parametrize("mode", [0o1733, 0o1777, 0o755, 0o700, 0o3733])
def test_a_spool_of_roots_that_others_cannot_rewrite_has_no_problem(mode):
    assert spool_problem(dir_stat(0, mode)) is None


@pytest.mark.parametrize("mode", [0o777, 0o733, 0o775, 0o757, 0o2777])
def test_a_spool_writable_by_others_without_the_sticky_bit_is_refused(mode):
    assert spool_problem(dir_stat(0, mode)) == f"it has mode {mode:04o}: writable, not sticky"


def test_a_spool_not_a_directory_of_roots_is_refused():
    assert spool_problem(dir_stat(1000, 0o1733)) == "it is not a directory owned by root"
    regular = os.stat_result((stat.S_IFREG | 0o1733, 0, 0, 1, 0, 0, 0, 0, 0, 0))
    assert spool_problem(regular) == "it is not a directory owned by root"


def test_a_symlink_is_refused_as_a_spool_by_both_sides(tmp_path, monkeypatch):
    """on_death, cancel_hook and the agent open the spool alike (O_NOFOLLOW, then fstat):
    a symlink or a file is refused by both, with the same words. (As a user other than
    root, every directory here is refused too, for not being root's.)"""
    (tmp_path / "file").write_text("")
    (tmp_path / "link").symlink_to(tmp_path)
    for name, why in [
        ("file", "it is not a directory owned by root"),
        ("link", "it is a symlink, not a directory owned by root"),
    ]:
        path = str(tmp_path / name)
        with pytest.raises(PermissionError) as err:
            open_spool(path)
        assert (err.value.errno, err.value.strerror) == (errno.EPERM, f"{why}{TAMPER}")
        with pytest.raises(EntryError, match=rf"^{why}{TAMPER}$"):
            spool_fd(path)
        monkeypatch.setenv(ENV_HOOK_DIR, path)
        with pytest.raises(PermissionError, match=why):
            on_death(["true"])
        with pytest.raises(PermissionError, match=why):
            cancel_hook("0" * 32)


# -- read_entry: one hook of a spool, as any user -------------------------------------------------


@pytest.fixture
def spool(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    """A directory of the test's own standing for the spool; (its path, an fd of it)."""
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield tmp_path, fd
    finally:
        os.close(fd)


def hook_id(n: int) -> str:
    return f"{n:032x}"


def write(path: Path, content: dict | bytes, mode: int = 0o600) -> Path:
    """A hook as on_death leaves one: `path` a directory of the caller's (0700) holding
    hook.json with `content`."""
    path.mkdir(mode=0o700, exist_ok=True)
    file = path / HOOK_FILE
    file.write_bytes(content if isinstance(content, bytes) else json.dumps(content).encode())
    os.chmod(file, mode)
    return file


def refusal(spool: tuple[Path, int], name: str) -> str:
    with pytest.raises(EntryError) as err:
        read_entry(FORMAT, KIND, spool[1], name)
    return str(err.value)


def test_a_good_hook_is_read_with_who_owns_it(spool):
    top, fd = spool
    name = "a" * 32
    write(top / name, good())
    opened = read_entry(FORMAT, KIND, fd, name)
    try:
        hook, st = opened.entry, os.fstat(opened.fd)
        assert opened.body == json.loads((top / name / HOOK_FILE).read_text())
        assert (hook.kind, hook.key, str(hook.owner)) == ("hook", name, OWNER)
        assert (hook.uid, hook.ino, hook.dev) == (os.getuid(), st.st_ino, st.st_dev)
        assert hook.dir_ino == (top / name).stat().st_ino
        assert hook.name == f"{'a' * 32}: curl -X DELETE http://127.0.0.1/sandboxes/1"
    finally:
        opened.close()


def test_what_the_index_shows_of_a_hook_is_short_and_printable(spool):
    top, fd = spool
    write(top / hook_id(1), good(argv=["sh", "-c", "echo\nforged line\x1b[2J", "x" * 500]))
    opened = read_entry(FORMAT, KIND, fd, hook_id(1))
    opened.close()
    hook = opened.entry
    assert hook.name.isprintable() and "echo\\nforged line\\x1b[2J" in hook.name
    assert "x" * 200 not in hook.name  # its command's start, cut short


def test_a_missing_hook_or_an_empty_hook_directory_is_gone_not_refused(spool):
    with pytest.raises(FileNotFoundError):
        read_entry(FORMAT, KIND, spool[1], hook_id(1))
    (spool[0] / hook_id(2)).mkdir(mode=0o700)
    with pytest.raises(FileNotFoundError):
        read_entry(FORMAT, KIND, spool[1], hook_id(2))


def test_what_is_not_a_hooks_own_directory_is_refused(spool):
    top, _ = spool
    target = write(top / hook_id(1), good())
    (top / hook_id(2)).symlink_to(top / hook_id(1))
    (top / f"{hook_id(3)}.json").write_text(json.dumps(good()))  # the old, flat layout
    os.mkfifo(top / hook_id(4), 0o600)
    write(top / "not-an-id", good())
    write(top / hook_id(5), good())
    os.chmod(top / hook_id(5), 0o770)
    (top / hook_id(6)).mkdir(mode=0o700)
    (top / hook_id(6) / HOOK_FILE).symlink_to(target)
    (top / hook_id(7)).mkdir(mode=0o700)
    os.mkfifo(top / hook_id(7) / HOOK_FILE, 0o600)  # never blocks
    (top / hook_id(8)).mkdir(mode=0o700)
    os.link(target, top / hook_id(8) / HOOK_FILE)
    assert refusal(spool, hook_id(2)) == "it is a symlink"
    assert refusal(spool, f"{hook_id(3)}.json").startswith(
        "it is a hook file directly in the spool (the layout before hook directories)"
    )
    assert refusal(spool, hook_id(4)) == "it is a FIFO, not a hook's directory"
    assert refusal(spool, "not-an-id") == "its name is not a hook id (32 hex digits)"
    assert refusal(spool, hook_id(5)) == "its directory is writable by group or others (mode 0770)"
    assert refusal(spool, hook_id(6)) == "its hook.json is a symlink"
    assert refusal(spool, hook_id(7)) == "its hook.json is a FIFO, not a regular file"
    assert refusal(spool, hook_id(8)) == "its hook.json has 2 links, not 1"


@pytest.mark.parametrize("mode", [0o620, 0o602, 0o666])
def test_a_hook_file_others_could_rewrite_is_refused(spool, mode):
    write(spool[0] / hook_id(1), good(), mode)
    why = refusal(spool, hook_id(1))
    assert why == f"its hook.json is writable by group or others (mode {mode:04o})"


def test_a_hook_file_that_is_too_large_or_not_utf8_json_is_refused(spool):
    top, _ = spool
    write(top / hook_id(1), good(argv=["true", "x" * HOOK_MAX_BYTES]))
    write(top / hook_id(2), b'{"owner": "caf\xe9"}')
    write(top / hook_id(3), b'{"owner": ')
    write(top / hook_id(4), b'{"owner": "\\"' + b'\\"' * 1000)
    assert refusal(spool, hook_id(1)) == f"it is larger than {HOOK_MAX_BYTES} bytes"
    for n in (2, 3, 4):
        assert refusal(spool, hook_id(n)) == "it is not UTF-8 JSON", n


def test_a_hook_file_nested_too_deeply_is_refused_for_that_on_every_python(spool):
    """Decided before json.loads, whose own limit moves with the interpreter (3.11 gives up
    at 1,000 levels, 3.13 parses 4,000)."""
    top, fd = spool
    deep = JSON_MAX_DEPTH + 1
    write(top / hook_id(1), b"[" * 4000)
    write(top / hook_id(2), b"[" * 2000 + b"]" * 2000)
    write(top / hook_id(3), b"[" * deep + b"]" * deep)
    write(top / hook_id(4), good(env={"A": "[" * 3000}))  # in a string: no nesting
    for n in (1, 2, 3):
        assert refusal(spool, hook_id(n)) == "it is JSON nested too deeply", n
    opened = read_entry(FORMAT, KIND, fd, hook_id(4))
    opened.close()
    assert opened.body["env"] == {"A": "[" * 3000}


def test_a_hook_file_of_a_bad_shape_or_owner_is_refused_for_that(spool):
    top, _ = spool
    write(top / hook_id(1), good(timeout=0))
    write(top / hook_id(2), good(owner="1:2:3"))
    assert refusal(spool, hook_id(1)) == hook_problem(good(timeout=0))
    assert refusal(spool, hook_id(2)).startswith("it names a bad owner: ")
