"""Exact, narrow readers of /proc. Nothing here interprets what it reads."""

from __future__ import annotations

import os
from dataclasses import dataclass

PROC = "/proc"
# Inode numbers of the initial namespaces (PROC_PID_INIT_INO and its siblings).
HOST_NAMESPACES = {"pid": 0xEFFFFFFC, "user": 0xEFFFFFFD, "time": 0xEFFFFFFA}
PF_EXITING = 0x4  # a task in do_exit() (include/linux/sched.h)


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
    pgrp: int = 0  # its process group (field 5)


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
        pgrp=int(rest[2]),
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
    rest = _stat_fields(pid, proc)
    if len(rest) > 48:
        return int(rest[19]), int(rest[47]), int(rest[48])
    return int(rest[19]), 0, 0


def lineage(pid: int, proc: str = PROC) -> tuple[int, int, int, int, int]:
    """(start time, environment start, environment end, parent pid, process group) of PID,
    from raw bytes of /proc/PID/stat, as identity() reads them: what a walk up a process
    tree needs of each process, at a fraction of read_stat's cost.

    Raises ProcessLookupError when the process is gone.
    """
    rest = _stat_fields(pid, proc)
    env = (int(rest[47]), int(rest[48])) if len(rest) > 48 else (0, 0)
    return int(rest[19]), env[0], env[1], int(rest[1]), int(rest[2])


def _stat_fields(pid: int, proc: str) -> list[bytes]:
    """The raw fields of /proc/PID/stat after the command name (field 3 on), unparsed.
    Raises ProcessLookupError when the process is gone."""
    try:
        fd = os.open(f"{proc}/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    except (FileNotFoundError, ProcessLookupError) as err:
        raise ProcessLookupError(pid) from err
    try:
        data = os.read(fd, 4096)
    except ProcessLookupError as err:  # ESRCH: the task went away between open and read
        raise ProcessLookupError(pid) from err
    finally:
        os.close(fd)
    end = data.rfind(b")")
    if end < 0:  # nothing read: the task went away meanwhile
        raise ProcessLookupError(pid)
    return data[end + 2 :].split()


def _read_bytes(path: str, pid: int, limit: int) -> bytes:
    """Up to `limit` bytes of a file of /proc/PID. Raises ProcessLookupError when the
    process is gone, OSError for any other failure."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except (FileNotFoundError, ProcessLookupError) as err:
        raise ProcessLookupError(pid) from err
    try:
        chunks, left = [], limit
        while left > 0:
            try:
                data = os.read(fd, min(left, 65536))
            except ProcessLookupError as err:  # ESRCH: gone between open() and read()
                raise ProcessLookupError(pid) from err
            if not data:
                break
            chunks.append(data)
            left -= len(data)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _status_line(pid: int, key: bytes, proc: str) -> list[bytes]:
    """The fields of line `key` ("NSpid:") of /proc/PID/status. Raises ProcessLookupError
    when the process is gone, OSError when the line cannot be read."""
    data = _read_bytes(f"{proc}/{pid}/status", pid, 1 << 16)
    for line in data.split(b"\n"):
        if line.startswith(key):
            return line.split()[1:]
    if not data:  # the task went away meanwhile
        raise ProcessLookupError(pid)
    raise OSError(f"{proc}/{pid}/status has no {key.decode()} line")


def uids(pid: int, proc: str = PROC) -> tuple[int, int, int, int]:
    """PID's real, effective, saved and file-system uids (the Uid line of
    /proc/PID/status), as this process's user namespace sees them. Any reader may read
    them. Raises ProcessLookupError when it is gone, OSError when they cannot be read."""
    real, effective, saved, fs = (int(u) for u in _status_line(pid, b"Uid:", proc)[:4])
    return real, effective, saved, fs


def nspid(pid: int, proc: str = PROC) -> tuple[int, ...]:
    """PID's pids in each pid namespace it is in, from the one this /proc belongs to down to
    its own (the NSpid line of /proc/PID/status): one pid for a process of that namespace,
    and a last pid of 1 for a namespace's init. Any reader may read it. Raises
    ProcessLookupError when the process is gone, OSError when the line cannot be read."""
    return tuple(int(p) for p in _status_line(pid, b"NSpid:", proc))


def cmdline(pid: int, limit: int, proc: str = PROC) -> list[bytes]:
    """PID's arguments (at most `limit` bytes of them), as /proc/PID/cmdline gives them:
    none for a kernel thread or a zombie. Raises ProcessLookupError when it is gone."""
    data = _read_bytes(f"{proc}/{pid}/cmdline", pid, limit)
    if data.endswith(b"\0"):
        data = data[:-1]
    return data.split(b"\0") if data else []


def cgroup(pid: int, proc: str = PROC) -> str:
    """The text of /proc/PID/cgroup: its cgroup in each hierarchy, as this process's cgroup
    namespace names them. Raises ProcessLookupError when it is gone."""
    return _read_bytes(f"{proc}/{pid}/cgroup", pid, 1 << 16).decode("utf-8", "replace")


def thread_ids(pid: int, proc: str = PROC) -> list[int]:
    """The ids of PID's live threads. Raises ProcessLookupError when the process is gone."""
    try:
        return [int(tid) for tid in os.listdir(f"{proc}/{pid}/task")]
    except (FileNotFoundError, ProcessLookupError) as err:
        raise ProcessLookupError(pid) from err


def exiting(pid: int, tid: int | None = None, proc: str = PROC) -> bool:
    """Whether the task has entered do_exit() (PF_EXITING); a vanished one has."""
    try:
        return read_stat(pid, proc, tid=tid).flags & PF_EXITING != 0
    except ProcessLookupError:
        return True


def group_exiting(pid: int, proc: str = PROC) -> bool:
    """Whether every thread of `pid` is in do_exit(): its last one may be past the point
    where an exit is reported."""
    if not exiting(pid, proc=proc):
        return False
    try:
        tids = thread_ids(pid, proc)
    except ProcessLookupError:
        return True
    return all(exiting(pid, tid, proc) for tid in tids)


def namespace(pid: int | str, name: str, proc: str = PROC) -> int | None:
    """The inode of PID's namespace `name` ("pid", ...), which identifies it; None when the
    process is gone or the kernel has no such namespace. Raises PermissionError where the
    reader may not look (another's process, without CAP_SYS_PTRACE): that says nothing of
    which namespace it is in."""
    try:
        return os.stat(f"{proc}/{pid}/ns/{name}").st_ino
    except (FileNotFoundError, ProcessLookupError):
        return None


CAP_SYS_PTRACE = 19


def capable(cap: int, proc: str = PROC) -> bool:
    """Whether this process holds capability `cap` (a CAP_* number) in its effective set,
    from the CapEff line of /proc/self/status."""
    with open(f"{proc}/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> cap & 1)
    return False


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
