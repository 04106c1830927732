"""Exact, narrow readers of /proc. Nothing here interprets what it reads."""

from __future__ import annotations

import os
from dataclasses import dataclass

PROC = "/proc"
# Inode numbers of the initial namespaces (PROC_PID_INIT_INO and its siblings).
HOST_NAMESPACES = {"pid": 0xEFFFFFFC, "user": 0xEFFFFFFD, "time": 0xEFFFFFFA}


@dataclass(frozen=True)
class Stat:
    """The fields of /proc/PID/stat that exitwatch uses."""

    pid: int
    comm: str
    state: str
    ppid: int
    flags: int  # PF_* (field 9)
    num_threads: int
    starttime: int  # clock ticks since boot (field 22)
    exit_code: int | None  # raw wait status (field 52), meaningful once the task has exited
    # Where the environment lies in memory (fields 50-51): a new one at every exec. Zeros
    # to a reader without ptrace access, None on kernels before 3.5.
    env_area: tuple[int, int] | None = None


def boot_id(proc: str = PROC) -> str:
    with open(f"{proc}/sys/kernel/random/boot_id", encoding="ascii") as f:
        return f.read().strip()


def btime(proc: str = PROC) -> int:
    """The unix time the host booted, in whole seconds, by the kernel's own clock now (the
    `btime` line of /proc/stat): it moves when the clock is stepped, but not with a clock
    shifted for one process alone."""
    with open(f"{proc}/stat", encoding="ascii") as f:
        for line in f:
            if line.startswith("btime "):
                return int(line.split()[1])
    raise ValueError(f"{proc}/stat has no btime line")


def parse_stat(data: str) -> Stat:
    """Parse the text of /proc/PID/stat.

    comm may hold spaces and parentheses, so the fields start after the *last* ')'.
    """
    lparen = data.index("(")
    rparen = data.rindex(")")
    rest = data[rparen + 2 :].split()
    # rest[0] is field 3; field N is rest[N - 3].
    return Stat(
        pid=int(data[:lparen]),
        comm=data[lparen + 1 : rparen],
        state=rest[0],
        ppid=int(rest[1]),
        flags=int(rest[6]),
        num_threads=int(rest[17]),
        starttime=int(rest[19]),
        exit_code=int(rest[49]) if len(rest) > 49 else None,
        env_area=(int(rest[47]), int(rest[48])) if len(rest) > 48 else None,
    )


def read_stat(pid: int, proc: str = PROC, tid: int | None = None) -> Stat:
    """Read /proc/PID/stat (or one thread's, /proc/PID/task/TID/stat).

    Raises ProcessLookupError when the process (or thread) is gone.
    """
    path = f"{proc}/{pid}/stat" if tid is None else f"{proc}/{pid}/task/{tid}/stat"
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            data = f.read()
    except (FileNotFoundError, ProcessLookupError) as err:
        # ESRCH: the task went away between open() and read().
        raise ProcessLookupError(pid) from err
    return parse_stat(data)


def identity(pid: int, proc: str = PROC) -> tuple[int, int, int]:
    """(start time, environment start, environment end) of PID, from /proc/PID/stat: what
    tells one exec of one process from any other. Made for a scan of every process, so it
    reads raw bytes and parses nothing else (a third of read_stat's cost). The area is
    (0, 0) to a reader without ptrace access and on kernels before 3.5.

    Raises ProcessLookupError when the process is gone.
    """
    try:
        fd = os.open(f"{proc}/{pid}/stat", os.O_RDONLY)
    except (FileNotFoundError, ProcessLookupError) as err:
        raise ProcessLookupError(pid) from err
    try:
        data = os.read(fd, 4096)
    finally:
        os.close(fd)
    end = data.rfind(b")")
    if end < 0:  # nothing read: the task went away meanwhile
        raise ProcessLookupError(pid)
    rest = data[end + 2 :].split()
    if len(rest) > 48:
        return int(rest[19]), int(rest[47]), int(rest[48])
    return int(rest[19]), 0, 0


def thread_ids(pid: int, proc: str = PROC) -> list[int]:
    """The ids of PID's live threads. Raises ProcessLookupError when the process is gone."""
    try:
        return [int(tid) for tid in os.listdir(f"{proc}/{pid}/task")]
    except (FileNotFoundError, ProcessLookupError) as err:
        raise ProcessLookupError(pid) from err


def namespace(pid: int | str, name: str, proc: str = PROC) -> int | None:
    """The inode of PID's namespace `name` ("pid", ...), which identifies it; None when the
    process is gone or the kernel has no such namespace."""
    try:
        return os.stat(f"{proc}/{pid}/ns/{name}").st_ino
    except OSError:
        return None


def foreign_namespace(*names: str, proc: str = PROC) -> str | None:
    """The first of `names` ("pid", "user", "time") in which this process is not in the
    host's namespace, or None. A kernel without a kind of namespace counts as the host's."""
    for name in names:
        try:
            inode = os.stat(f"{proc}/self/ns/{name}").st_ino
        except FileNotFoundError:
            continue
        if inode != HOST_NAMESPACES[name]:
            return name
    return None
