"""The helpers of the checks that tests/systemd/vm.sh runs in its VM, as root, under a systemd
that is PID 1 (checks.py has the checks). The guest's Debian python3 and its standard library
alone: nothing of the project is imported, so that the checks see the installed package and
nothing else.

Every wait is on a condition with a deadline (`within`); what a check found wrong is raised
as `Failed`, whose message is the FAIL line's detail."""

from __future__ import annotations

import collections
import contextlib
import json
import os
import re
import socket
import subprocess
import threading
import time

STATUS_SOCKET = "/run/exitwatch/exitwatch.sock"
ADOPT_SOCKET = "/run/exitwatch/docker.sock"
IMAGE = "rig/busybox:1"  # busybox alone
RUNNER_IMAGE = "rig/runner:1"  # busybox and the docker CLI, for runners in containers


class Failed(Exception):
    """A check's condition did not hold; the message says what was seen instead."""


def sh(
    cmd: str | list[str],
    *,
    user: str | None = None,
    check: bool = True,
    timeout: float = 300,
    env: dict | None = None,
) -> subprocess.CompletedProcess:
    """Runs a command (a string goes to sh -c), as root or as `user` (setpriv: it execs, so
    the process is the user's own, with the user's groups and a fresh environment)."""
    argv = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
    if user:
        argv = as_user(user) + argv
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    if check and done.returncode != 0:
        out = (done.stdout + done.stderr).strip().splitlines()[-8:]
        raise Failed(f"{cmd!r} exited {done.returncode}: " + " | ".join(out))
    return done


def out(cmd: str | list[str], **kw) -> str:
    return sh(cmd, **kw).stdout.strip()


def as_user(user: str) -> list[str]:
    return ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", "--reset-env", "--"]


def spawn(cmd: str, *, user: str | None = None) -> subprocess.Popen:
    """A long-lived process whose pid is the process itself (sh, or setpriv's exec of sh)."""
    argv = ["/bin/sh", "-c", cmd]
    if user:
        argv = as_user(user) + argv
    return subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def within(seconds: float, cond, what: str, *, every: float = 0.1, fail_fast=None) -> float:
    """Waits until cond() is true and returns how long it took; Failed after `seconds`, or
    as soon as fail_fast() returns a reason."""
    start = time.monotonic()
    last = None
    while True:
        try:
            if cond():
                return time.monotonic() - start
        except (Failed, OSError, ValueError, KeyError, subprocess.SubprocessError) as err:
            last = err
        if fail_fast is not None:
            why = fail_fast()
            if why:
                raise Failed(f"{what}: {why}")
        if time.monotonic() - start > seconds:
            raise Failed(f"not within {seconds:g} s: {what}" + (f" (last: {last})" if last else ""))
        time.sleep(every)


def watch(conds: dict, seconds: float, every: float = 0.05) -> dict:
    """Polls each condition on a thread of its own, all at once, from now for up to
    `seconds`, and returns when each first held (seconds from now), or None: one slow
    condition (a docker call) does not delay the timing of the others."""
    start = time.monotonic()
    took: dict = dict.fromkeys(conds)

    def poll(name: str, cond) -> None:
        while time.monotonic() - start <= seconds:
            try:
                if cond():
                    took[name] = time.monotonic() - start
                    return
            except (Failed, OSError, ValueError, KeyError, subprocess.SubprocessError):
                pass
            time.sleep(every)

    threads = [threading.Thread(target=poll, args=item) for item in conds.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return took


def status() -> dict:
    """The agent's status document, read from its socket (what `exitwatch status --json`
    prints; the CLI is run once by a check of its own, and costs a Python start a call)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect(STATUS_SOCKET)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return json.loads(b"".join(chunks))


def answers() -> bool:
    try:
        status()
        return True
    except (OSError, ValueError):
        return False


def owner_of(pid: int) -> dict | None:
    for owner in status().get("owners", []):
        if owner["pid"] == pid:
            return owner
    return None


def unit(name: str, *props: str) -> dict:
    text = out(["systemctl", "show", name, "-p", ",".join(props)])
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def main_pid(name: str = "exitwatch") -> int:
    return int(unit(name, "MainPID")["MainPID"])


def running(name: str = "exitwatch") -> bool:
    u = unit(name, "ActiveState", "SubState")
    return u["ActiveState"] == "active" and u["SubState"] == "running"


def callbacks() -> str:
    """Where libffi put the agent's ctypes callbacks: under MemoryDenyWriteExecute=yes a
    libffi without static trampolines (bookworm's) maps them from a memfd, MAP_SHARED, which
    a fork shares (docs/changes.md, the SIGABRT at start). Trixie's (3.4.8) does the same:
    its first run here saw the 2 mappings that bookworm's show."""
    with open(f"/proc/{main_pid()}/maps") as f:
        shared = sum("/memfd:libffi" in line for line in f)
    return f"{shared} shared memfd mapping(s)" if shared else "no shared mapping"


def journal_cursor() -> str:
    text = out(["journalctl", "-n", "0", "--show-cursor", "--quiet"])
    return text.rsplit("cursor: ", 1)[-1] if "cursor: " in text else ""


def entries(cursor: str = "", unit_name: str = "exitwatch") -> list[tuple[str, str]]:
    """The unit's journal entries after `cursor` (or in this boot): (`IDENT[PID]`, message)
    each. Not `--after-cursor`: with a match (-u), systemd before 255 (bookworm's 252)
    skips the first matching entry after the cursor too (systemd #30288), and the agent's
    first line after a check's cursor was lost; `--cursor` keeps it, and the cursor's own
    entry is left out here."""
    argv = ["journalctl", "--no-pager", "-o", "json", "-u", unit_name]
    argv += ["--output-fields=MESSAGE,SYSLOG_IDENTIFIER,_PID"]
    argv += ["--cursor", cursor] if cursor else ["-b"]
    found = []
    for line in out(argv).splitlines():
        entry = json.loads(line)
        if cursor and entry.get("__CURSOR") == cursor:
            continue
        message = entry.get("MESSAGE") or ""
        if isinstance(message, list):  # not UTF-8: journalctl gives its bytes
            message = bytes(message).decode(errors="replace")
        found.append((f"{entry.get('SYSLOG_IDENTIFIER')}[{entry.get('_PID')}]", message))
    return found


def journal(cursor: str = "", unit_name: str = "exitwatch") -> str:
    """The messages alone (journalctl -o cat), after `cursor` or in this boot."""
    return "\n".join(message for _who, message in entries(cursor, unit_name))


# The deaths by signal that the checks cause on purpose, by (unit, signal name as systemd
# writes it): a SIGKILL of a main pid, systemd's SIGABRT at a watchdog timeout. Any other is
# the agent's own crash (`signal_deaths`).
MEANT: collections.Counter = collections.Counter()
_DEATH = re.compile(r"Main process exited, code=(?:killed|dumped), status=\d+/(\w+)")
_FATAL = re.compile(r"\[(\d+)\]: Fatal Python error: (.*)")


def meant_death(unit_name: str, signal_name: str) -> None:
    """A check is about to make the unit's main process die of this signal."""
    MEANT[(unit_name, signal_name)] += 1


def unmeant_deaths(cursor: str, units: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """Since `cursor` (or the boot), for each unit: what is wrong (its main processes died of
    signals beyond those MEANT, or its processes wrote more Python fatal errors than the
    SIGABRTs meant), and what was seen."""
    problems, seen = [], []
    for name in units:
        text = "\n".join(f"{who}: {message}" for who, message in entries(cursor, name))
        deaths = collections.Counter(m.group(1) for m in _DEATH.finditer(text))
        fatal = [f"pid {m.group(1)}: {m.group(2)}" for m in _FATAL.finditer(text)]
        meant = collections.Counter({sig: n for (u, sig), n in MEANT.items() if u == name})
        if deaths - meant or len(fatal) > meant["ABRT"]:
            problems.append(f"{name} died of {dict(deaths)}, meant {dict(meant)}; {fatal}")
        seen.append(f"{name} {'+'.join(sorted(deaths.elements())) or 'none'}")
    return problems, seen


def own_lines(unit_name: str) -> list[str]:
    """What the unit's own processes logged in this boot (not systemd's lines about it)."""
    return out(
        ["journalctl", "-b", "--no-pager", "-o", "cat", f"_SYSTEMD_UNIT={unit_name}"]
    ).splitlines()


def starttime(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return None if fields[0] == "Z" else fields[19]


def alive(pid: int, start: str) -> bool:
    """The process (pid, start time) still runs: not gone, not reused, not a zombie."""
    return starttime(pid) == start


def container_exists(ref: str) -> bool:
    return sh(["docker", "inspect", ref], check=False).returncode == 0


def labels_of(ref: str) -> dict:
    text = out(["docker", "inspect", "-f", "{{json .Config.Labels}}", ref])
    return json.loads(text) or {}


def read(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


def wait_file(path: str, seconds: float = 120) -> str:
    within(seconds, lambda: os.path.exists(path), f"{path} written")
    return read(path)


def kill(pid: int, sig: int = 9) -> None:
    """Signals one process. Never pid 0 or below: a unit with no main pid says MainPID=0, and
    kill(0) would signal the checks' own process group (their ssh session with it)."""
    if pid <= 0:
        raise Failed(f"no process to signal (pid {pid})")
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""
