"""The runner's side of what the agent does while an owner lives: leases (a command run as
the owner's user every so often, for as long as the owner lives) and the watchdog (the agent
ends an owner that stopped petting it). Each lives in a spool of its own, with the hooks'
rules (contract.py): a directory of the caller's per entry, holding one JSON file.

docs/hooks.md ("Leases", "Watchdogs") tells the contract; kinds/leases and
kinds/watchdogs are the agent's side.
"""

from __future__ import annotations

import errno
import hashlib
import math
import os
import secrets
import time
from collections.abc import Mapping, Sequence

from exitwatch import procfs
from exitwatch.contract import (
    HOOK_MAX_TIMEOUT,
    add_entry,
    cancel_entry,
    entry_json,
    hook_problem,
    is_hook_id,
    open_spool,
)
from exitwatch.owner import Owner, owner_of

LEASE_DIR = "/var/spool/exitwatch/leases"
ENV_LEASE_DIR = "EXITWATCH_LEASE_DIR"
LEASE_FILE = "lease.json"  # the one file of <spool>/<lease id>/
# A lease runs at most once a second: a provider's keepalive needs minutes, and a lease of
# 0.01 s would be a fork bomb run by root on a user's behalf.
LEASE_MIN_EVERY = 1.0
LEASE_MAX_EVERY = 86400.0
# Set for each run of a lease: the owner it keeps something alive for.
ENV_LEASE_OWNER = "EXITWATCH_LEASE_OWNER"

WATCHDOG_DIR = "/var/spool/exitwatch/watchdogs"
ENV_WATCHDOG_DIR = "EXITWATCH_WATCHDOG_DIR"
WATCHDOG_FILE = "watchdog.json"  # the one file of <spool>/<watchdog id>/; a pet touches it
WATCHDOG_MIN_TIMEOUT = 1.0
WATCHDOG_MAX_TIMEOUT = 30 * 86400.0
WATCHDOG_MAX_GRACE = 3600.0
WATCHDOG_GRACE = 10.0  # seconds between SIGTERM and SIGKILL, unless the runner says
REASON_MAX = 200  # characters of a watchdog's reason, which the agent's lines quote


def lease_dir() -> str:
    """The lease spool the runner writes to: EXITWATCH_LEASE_DIR, or the system's."""
    return os.environ.get(ENV_LEASE_DIR) or LEASE_DIR


def watchdog_dir() -> str:
    """The watchdog spool the runner writes to: EXITWATCH_WATCHDOG_DIR, or the system's."""
    return os.environ.get(ENV_WATCHDOG_DIR) or WATCHDOG_DIR


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def lease_problem(body: object) -> str | None:
    """What is wrong with a lease file's decoded JSON, or None: a hook's shape (its
    timeout bounds each run), plus how often it runs."""
    if not isinstance(body, dict) or not _number(body.get("every")):
        return '"every" is not a number' if isinstance(body, dict) else "it is not a JSON object"
    problem = hook_problem({k: v for k, v in body.items() if k != "every"})
    if problem is not None:
        return problem
    if not LEASE_MIN_EVERY <= body["every"] <= LEASE_MAX_EVERY:
        return f'"every" is not in [{LEASE_MIN_EVERY:g}, {LEASE_MAX_EVERY:g}] seconds'
    return None


def watchdog_problem(body: object) -> str | None:
    """What is wrong with a watchdog file's decoded JSON, or None."""
    if not isinstance(body, dict):
        return "it is not a JSON object"
    want, optional = {"owner", "timeout", "grace", "created"}, {"reason"}
    if missing := sorted(want - body.keys()):
        return f"it lacks {', '.join(missing)}"
    if unknown := sorted(body.keys() - want - optional):
        return f"it has unknown keys {repr(unknown)[:100]}"
    if not isinstance(body["owner"], str):
        return '"owner" is not a string'
    for key, low, high in (
        ("timeout", WATCHDOG_MIN_TIMEOUT, WATCHDOG_MAX_TIMEOUT),
        ("grace", 0.0, WATCHDOG_MAX_GRACE),
    ):
        if not _number(body[key]):
            return f'"{key}" is not a number'
        if not low <= body[key] <= high:
            return f'"{key}" is not in [{low:g}, {high:g}] seconds'
    if not _number(body["created"]):
        return '"created" is not a number'
    reason = body.get("reason", "")
    if not isinstance(reason, str) or len(reason) > REASON_MAX:
        return f'"reason" is not a string of at most {REASON_MAX} characters'
    return None


# -- leases ----------------------------------------------------------------------------------


def while_alive(
    argv: Sequence[str | os.PathLike[str]],
    *,
    every: float,
    pid: int | None = None,
    timeout: float | None = None,
    env: Mapping[str, str] | None = None,
) -> str:
    """Have the agent run `argv` every `every` seconds for as long as process `pid`
    (default: the calling one) lives; the lease's id, for cancel_lease().

    It runs as the calling user, with a hook's rules (on_death): the current directory, a
    minimal environment plus `env` and EXITWATCH_LEASE_OWNER, killed after `timeout`
    seconds (default: `every`, at most an hour). It first runs when the agent sees it, then
    `every` seconds after each run started, never twice at once; a run under way when the
    owner dies is killed. Raises ValueError for a malformed lease, OSError when the spool
    is not writable, ProcessLookupError when there is no process `pid`.
    """
    try:
        cwd = os.getcwd()
    except FileNotFoundError:
        cwd = ""
    if not _number(every):
        raise ValueError(f"bad lease: every={every!r} is not a number of seconds")
    body = {
        "owner": str(owner_of(pid)),
        "argv": [os.fsdecode(a) for a in argv],
        "cwd": cwd,
        "env": dict(env or {}),
        "every": every,
        "timeout": min(every, HOOK_MAX_TIMEOUT) if timeout is None else timeout,
        "created": round(time.time(), 3),
    }
    problem = lease_problem(body)
    if problem is not None:
        raise ValueError(f"bad lease: {problem}")
    data = entry_json(body, "lease")
    lease_id = secrets.token_hex(16)
    add_entry(lease_dir(), lease_id, LEASE_FILE, data)
    return lease_id


def cancel_lease(lease_id: str) -> bool:
    """Stop the lease `lease_id` (the runner no longer needs it); False if it was not
    there. A run under way ends by itself. Raises ValueError for a malformed id and
    PermissionError for another user's lease."""
    if not isinstance(lease_id, str) or not is_hook_id(lease_id):
        raise ValueError(
            f"{lease_id!r} is not a lease id (32 hex digits): give the id that while_alive "
            "(exitwatch while-alive) printed"
        )
    return cancel_entry(lease_dir(), lease_id, LEASE_FILE, "lease")


# -- the watchdog ----------------------------------------------------------------------------


def watchdog_id(owner: Owner | str, uid: int | None = None) -> str:
    """The id of the watchdog that user `uid` (default: this one) arms on `owner`: one
    per owner and user, so that `exitwatch watchdog --pet` finds it from the owner alone
    (users may not list the spool)."""
    uid = os.geteuid() if uid is None else uid
    return hashlib.sha256(f"{uid}:{owner}".encode()).hexdigest()[:32]


class Watchdog:
    """A watchdog armed on an owner: pet() it while the owner makes progress; cancel() it
    when the owner no longer wants it. Also a context manager that cancels it on exit."""

    def __init__(self, owner: Owner, watchdog_id: str, spool: str) -> None:
        self.owner = owner
        self.id = watchdog_id
        self._spool = spool

    def pet(self) -> bool:
        """Tell the agent the owner makes progress (the agent sees the file's change time);
        False when there is no such watchdog any more (cancelled, or its owner is dead)."""
        spool = open_spool(self._spool)
        try:
            # Its directory through no symlink, and the caller's: once it is gone, anyone
            # may put something by its name (its id can be computed) into the spool.
            flags = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
            try:
                dir_fd = os.open(self.id, flags, dir_fd=spool)
            except (FileNotFoundError, NotADirectoryError):
                return False
            except OSError as err:
                if err.errno == errno.ELOOP:
                    return False
                raise
            try:
                if os.fstat(dir_fd).st_uid != os.geteuid():
                    return False
                os.utime(WATCHDOG_FILE, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                return False
            finally:
                os.close(dir_fd)
        finally:
            os.close(spool)
        return True

    def cancel(self) -> bool:
        """Disarm it; False if it was not armed any more."""
        return cancel_entry(self._spool, self.id, WATCHDOG_FILE, "watchdog")

    def __enter__(self) -> Watchdog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cancel()


def watchdog(
    timeout: float,
    *,
    pid: int | None = None,
    grace: float = WATCHDOG_GRACE,
    reason: str = "",
) -> Watchdog:
    """Arm a watchdog on process `pid` (default: the calling one): once `timeout` seconds
    pass without a pet(), the agent sends it SIGTERM (and SIGCONT), then SIGKILL `grace`
    seconds later, and it is a dead owner like any other. Arming it again (for the same
    process, by the same user) replaces the timeout and counts as a pet.

    Only the process's own user (or root) may: raises PermissionError for another user's
    process (the agent refuses such a watchdog anyway), ValueError for a bad timeout,
    ProcessLookupError when there is no process `pid`, OSError when the spool is not
    writable."""
    owner = owner_of(pid)
    uid = os.geteuid()
    if uid != 0:
        theirs = procfs.uids(owner.pid)
        if any(u != uid for u in theirs):
            raise PermissionError(
                f"process {owner.pid} runs as uid {theirs[0]}, not as you (uid {uid}): only "
                "its own user or root may arm a watchdog on it"
            )
    body = {
        "owner": str(owner),
        "timeout": timeout,
        "grace": grace,
        "created": round(time.time(), 3),
        "reason": reason,
    }
    problem = watchdog_problem(body)
    if problem is not None:
        raise ValueError(f"bad watchdog: {problem}")
    data = entry_json(body, "watchdog")
    spool, wid = watchdog_dir(), watchdog_id(owner, uid)
    # Armed again: the old entry goes and a new one comes, both seen in the spool (a file
    # replaced inside the entry's directory would raise no event there).
    cancel_entry(spool, wid, WATCHDOG_FILE, "watchdog")
    add_entry(spool, wid, WATCHDOG_FILE, data)
    return Watchdog(owner, wid, spool)


def find_watchdog(pid: int | None = None) -> Watchdog:
    """The watchdog this user armed on process `pid` (default: the calling one), to pet or
    cancel; it may be gone already (pet() and cancel() then return False)."""
    owner = owner_of(pid)
    spool = watchdog_dir()
    return Watchdog(owner, watchdog_id(owner), spool)
