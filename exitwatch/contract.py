"""The runner contract: the label, the marker, the hook spool, and the calls runners make."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import secrets
import stat
import time
from collections.abc import Mapping, Sequence

from exitwatch.owner import Owner, OwnerError, owner_of

LABEL_OWNER = "exitwatch.owner"
LABEL_KEEP = "exitwatch.keep"
# What the owner is, for people, beside its label: `exitwatch adopt` names a container's
# init "container NAME" there. `exitwatch status` shows it; nothing is decided by it.
LABEL_OWNER_NAME = "exitwatch.owner-name"
LABEL_COMPOSE_PROJECT = "com.docker.compose.project"
# On a runner container: `exitwatch adopt` makes it an owner (its init owns what its
# clients create). A container without it that mounts the socket is a client as a host
# process is (docs/adopt.md).
LABEL_ADOPT = "exitwatch.adopt"
ADOPT_OWNER = "owner"
MARKER = ".exitwatch-owner"
MARKER_MAX_BYTES = 4096
ENV_OWNER = "EXITWATCH_OWNER"
# Set beside ENV_OWNER by `exitwatch run` alone: a process carrying both is a run's, and
# dies with it (kinds/processes); ENV_OWNER alone is exported by shells for compose files.
ENV_RUN = "EXITWATCH_RUN"
# How deep the arrays and objects of a marker or a hook file may nest: theirs nest 1 and 2
# deep. Checked before parsing, because where json.loads gives up depends on the Python:
# 3.11 raises RecursionError on 1,000 levels, 3.13 parses 4,000, and a file's verdict must
# not change with the interpreter.
JSON_MAX_DEPTH = 32
# JSON strings, an unterminated one to the end of the text: a match never fails, so the
# scan is one pass however many quotes and backslashes a hostile file holds.
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*+(?:"|\\?\Z)', re.S)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


def kept(labels: Mapping[str, object]) -> bool:
    """Whether `labels` ask exitwatch to leave their container, network or volume alone."""
    return str(labels.get(LABEL_KEEP, "")).strip().lower() == "true"


def names_an_owner(labels: Mapping[str, object]) -> bool:
    """Whether `labels` carry an owner label that reads as an owner string. An empty one
    (compose's `"${EXITWATCH_OWNER}"` where the variable is unset) or a malformed one names
    nobody: the agent never judges it dead, so it would keep its container for good."""
    if LABEL_OWNER not in labels:
        return False
    try:
        Owner.parse(labels[LABEL_OWNER])  # type: ignore[arg-type]
    except OwnerError:
        return False
    return True


def nests_too_deeply(text: str) -> bool:
    """Whether the arrays and objects of JSON `text` nest deeper than JSON_MAX_DEPTH
    (brackets within strings do not count)."""
    depth = 0
    for bracket in _NOT_BRACKET.sub("", _JSON_STRING.sub("", text)):
        depth += 1 if bracket in "[{" else -1
        if depth > JSON_MAX_DEPTH:
            return True
    return False


def owner_labels(pid: int | None = None) -> dict[str, str]:
    """The labels that tie a container to process `pid` (default: the calling process)."""
    return {LABEL_OWNER: str(owner_of(pid))}


def mark_workdir(path: str | os.PathLike[str] | int, pid: int | None = None) -> None:
    """Mark directory `path` (or the directory open as descriptor `path`) as owned by
    process `pid` (default: the calling process).

    The marker is written to a temporary name and renamed into place, so the agent never
    reads a half-written one.
    """
    body = json.dumps({"owner": str(owner_of(pid))}).encode()
    given = isinstance(path, int)
    dir_fd = path if given else os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        tmp = f"{MARKER}.{os.getpid()}.tmp"
        fd = os.open(
            tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=dir_fd
        )
        try:
            # Past the umask: one of 0777 would leave it 0000, and its owner (an unprivileged
            # `exitwatch run` removing its own) could not read it back.
            os.fchmod(fd, 0o644)
            os.write(fd, body)
        finally:
            os.close(fd)
        os.rename(tmp, MARKER, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    finally:
        if not given:
            os.close(dir_fd)


# On-death hooks: each in a directory of its own in a spool that only root can list.
# docs/design.md ("On-death hooks") says why a hook lives in its writer's own directory.
HOOK_DIR = "/var/spool/exitwatch/hooks"
ENV_HOOK_DIR = "EXITWATCH_HOOK_DIR"
HOOK_FILE = "hook.json"  # the one file of <spool>/<hook id>/
HOOK_MAX_BYTES = 64 * 1024
# A hook holds one of the few hook workers (and one of its user's slots) while it runs:
# an hour is ample for a cleanup call, and bounds how long hung hooks can delay others.
HOOK_MAX_TIMEOUT = 3600.0
_HOOK_ID = re.compile(r"[0-9a-f]{32}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def hook_dir() -> str:
    """The spool the registering side writes to: EXITWATCH_HOOK_DIR, or the system's."""
    return os.environ.get(ENV_HOOK_DIR) or HOOK_DIR


def is_hook_id(name: str) -> bool:
    """Whether `name` is a hook's id, the name of its directory in the spool."""
    return bool(_HOOK_ID.fullmatch(name))


def hook_problem(body: object) -> str | None:
    """What is wrong with a hook file's decoded JSON, or None when it has the right shape.

    The owner string is checked by its own parser; this is the rest of the shape."""
    if not isinstance(body, dict):
        return "it is not a JSON object"
    want = {"owner", "argv", "cwd", "env", "timeout", "created"}
    if missing := sorted(want - body.keys()):
        return f"it lacks {', '.join(missing)}"
    if unknown := sorted(body.keys() - want):
        return f"it has unknown keys {repr(unknown)[:100]}"
    argv, env, timeout = body["argv"], body["env"], body["timeout"]
    if not isinstance(body["owner"], str):
        return '"owner" is not a string'
    if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)):
        return '"argv" is not a non-empty list of strings'
    if not argv[0] or any("\0" in a for a in argv):
        return '"argv" has an empty command or a NUL character'
    cwd = body["cwd"]
    if not isinstance(cwd, str) or "\0" in cwd or (cwd and not cwd.startswith("/")):
        return '"cwd" is not an absolute path or ""'
    if not isinstance(env, dict) or not all(
        isinstance(v, str) and "\0" not in v and _ENV_NAME.fullmatch(k) for k, v in env.items()
    ):
        return '"env" is not an object of NAME: "value" strings'
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        return '"timeout" is not a number'
    if not 0 < timeout <= HOOK_MAX_TIMEOUT:
        return f'"timeout" is not in (0, {HOOK_MAX_TIMEOUT:g}] seconds'
    if isinstance(body["created"], bool) or not isinstance(body["created"], int | float):
        return '"created" is not a number'
    if not all(map(_utf8, [body["owner"], *argv, cwd, *env.values()])):
        return "it has a string that is not valid UTF-8 (a lone surrogate)"
    return None


def _utf8(text: str) -> bool:
    """Whether `text` can be handed to exec: JSON may carry a lone surrogate ("\\ud800")."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def spool_problem(st: os.stat_result) -> str | None:
    """What makes a spool one that others could tamper with, or None: a symlink, not a
    directory of root's, or writable by others without the sticky bit (which alone keeps
    one user from removing or replacing another's hooks)."""
    if stat.S_ISLNK(st.st_mode):
        return "it is a symlink, not a directory owned by root"
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0:
        return "it is not a directory owned by root"
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        return f"it has mode {stat.S_IMODE(st.st_mode):04o}: writable, not sticky"
    return None


def open_spool(path: str, readable: bool = False) -> int:
    """The spool at `path`, opened as both sides open it: through no symlink at its end
    (O_NOFOLLOW), and checked through the descriptor. O_PATH unless `readable` (to list
    it: root only; users may add entries to the 1733 spool, not list it). Raises
    PermissionError (EPERM) for a spool that others could tamper with, and OSError when it
    cannot be opened."""
    fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        problem = spool_problem(os.fstat(fd))
        if problem is not None:
            raise PermissionError(errno.EPERM, f"{problem}; others could tamper with hooks", path)
        if not readable:
            return fd
        # The very directory just checked, reopened to be read.
        readable_fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
    except BaseException:
        os.close(fd)
        raise
    os.close(fd)
    return readable_fd


def on_death(
    argv: Sequence[str | os.PathLike[str]],
    *,
    pid: int | None = None,
    timeout: float = 60.0,
    env: Mapping[str, str] | None = None,
) -> str:
    """Have the agent run `argv` once process `pid` (default: the calling one) is dead;
    the hook's id, for cancel_hook().

    The command runs as the calling user, in the current directory (or HOME, if that is
    gone by then), with a minimal environment plus `env`, and is killed after `timeout`
    seconds. Raises ValueError for a malformed hook, OSError when the spool is not
    writable (PermissionError when it is not root's and sticky), ProcessLookupError when
    there is no process `pid`.
    """
    try:
        cwd = os.getcwd()
    except FileNotFoundError:  # removed under us: HOME it is
        cwd = ""
    body = {
        "owner": str(owner_of(pid)),
        "argv": [os.fsdecode(a) for a in argv],
        "cwd": cwd,
        "env": dict(env or {}),
        "timeout": timeout,
        "created": round(time.time(), 3),
    }
    problem = hook_problem(body)
    if problem is not None:
        raise ValueError(f"bad hook: {problem}")
    data = entry_json(body, "hook")
    hook_id = secrets.token_hex(16)
    add_entry(hook_dir(), hook_id, HOOK_FILE, data)
    return hook_id


def entry_json(body: dict, noun: str) -> bytes:
    """The file of a spool's entry (a `noun`'s), as JSON; ValueError past HOOK_MAX_BYTES,
    which the agent would refuse."""
    data = json.dumps(body).encode()
    if len(data) > HOOK_MAX_BYTES:
        raise ValueError(
            f"{noun} is {len(data)} bytes as JSON, at most {HOOK_MAX_BYTES}: shorten its "
            "command or its env"
        )
    return data


def add_entry(spool_path: str, entry_id: str, file: str, data: bytes) -> None:
    """Put a new entry `entry_id` into the spool at `spool_path`: a directory of the
    caller's, mode 0700, holding `file` (mode 0600) with `data`. Raises OSError
    (FileExistsError when the entry is there already)."""
    spool = open_spool(spool_path)
    try:
        # Made under a dot name (never read as an entry) and renamed into place whole: the
        # agent never sees an entry half written. A name of its own, which no one else can
        # take first (a watchdog's id is a hash anyone can compute).
        tmp = f".{entry_id}.{secrets.token_hex(8)}"
        os.mkdir(tmp, 0o700, dir_fd=spool)
        try:
            # Past the umask, before it is opened (a umask of 0777 leaves it 0000). By name:
            # in the sticky spool no one but its maker (and root) may replace it.
            os.chmod(tmp, 0o700, dir_fd=spool)
            dir_fd = os.open(tmp, _DIR_FLAGS, dir_fd=spool)
            try:
                write_new(dir_fd, file, data)
                os.fsync(dir_fd)  # a crash of the host must not leave an empty entry behind
            finally:
                os.close(dir_fd)
            # Not over an entry of the same name (a rename would replace an empty one).
            if _exists(spool, entry_id):
                raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), entry_id)
            os.rename(tmp, entry_id, src_dir_fd=spool, dst_dir_fd=spool)
        except BaseException:
            # No one else may remove it from the sticky spool.
            with contextlib.suppress(OSError):
                _remove_entry_dir(spool, tmp, file)
            raise
    finally:
        os.close(spool)


def _exists(dir_fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def write_new(dir_fd: int, name: str, data: bytes) -> None:
    """Write a new file `name` in the directory `dir_fd`, mode 0600 whatever the umask,
    through no symlink, and sync it."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(name, flags, 0o600, dir_fd=dir_fd)
    try:
        os.fchmod(fd, 0o600)  # past the umask: the agent refuses a file others could rewrite
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove_entry_dir(spool: int, name: str, file: str) -> None:
    """Remove the entry directory `name` of the spool (`spool` is its descriptor), with its
    `file`. Raises OSError: ENOTEMPTY when its writer put more in it, which stays."""
    dir_fd = os.open(name, _DIR_FLAGS, dir_fd=spool)
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(file, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)
    os.rmdir(name, dir_fd=spool)


def cancel_hook(hook_id: str) -> bool:
    """Remove the hook `hook_id` (after a clean teardown); False if it was not there.

    Only the user who registered a hook may cancel it: the spool's sticky bit enforces it
    for others, and this check for root too. Raises ValueError for a malformed id and
    PermissionError for another user's hook.
    """
    if not isinstance(hook_id, str) or not is_hook_id(hook_id):
        raise ValueError(
            f"{hook_id!r} is not a hook id (32 hex digits): give the id that on_death "
            "(exitwatch on-death) printed"
        )
    return cancel_entry(hook_dir(), hook_id, HOOK_FILE, "hook")


def cancel_entry(spool_path: str, entry_id: str, file: str, noun: str) -> bool:
    """Remove the entry `entry_id` of the spool at `spool_path`, a `noun`'s whose one file
    is `file`; False if it was not there. Only its maker may: PermissionError for another
    user's, root included."""
    spool = open_spool(spool_path)
    try:
        try:
            st = os.stat(entry_id, dir_fd=spool, follow_symlinks=False)
        except FileNotFoundError:
            return False
        if st.st_uid != os.geteuid():
            raise PermissionError(
                f"{noun} {entry_id} belongs to uid {st.st_uid}, not to you: cancel it as that user"
            )
        # Out of the agent's sight at once, under a dot name; then emptied and removed.
        # A name no one else can take first: a watchdog's id can be computed by anyone,
        # and a sticky spool keeps the rename from replacing another user's directory.
        gone = f".{entry_id}.{secrets.token_hex(8)}.cancelled"
        try:
            os.rename(entry_id, gone, src_dir_fd=spool, dst_dir_fd=spool)
        except FileNotFoundError:  # ran (or cancelled) just now
            return False
        with contextlib.suppress(OSError):  # what else its writer put there stays theirs
            _remove_entry_dir(spool, gone, file)
    finally:
        os.close(spool)
    return True
