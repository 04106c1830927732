"""A watched owner dies and its pid is taken at once by another process: only the source's
exit hint can bring the agent to judge it, and only the start time tells it is dead.

Nothing else wakes the agent here: the owner was admitted alive, nothing is lost, the
engine and the file system stay still, and the ebpf and netlink agents run with an hour's
poll interval (the poll source's tick is its hint)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from exitwatch import mark_workdir
from exitwatch.owner import death, owner_of
from exitwatch.sources import ebpf

from support.agentproc import Agent, agent_argv, container, exists, wait_gone
from support.procs import kill, spawn_owner

# clone3 with set_tid: a process with exactly the pid asked for (root only). It lives until
# its stdin closes; the parent prints its pid and waits for it.
_TAKE_PID_C = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <linux/sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
    pid_t want;
    struct clone_args args;
    long pid;
    char c;
    if (argc != 2)
        return 2;
    want = (pid_t)atoi(argv[1]);
    memset(&args, 0, sizeof args);
    args.exit_signal = SIGCHLD;
    args.set_tid = (uint64_t)(uintptr_t)&want;
    args.set_tid_size = 1;
    pid = syscall(SYS_clone3, &args, sizeof args);
    if (pid < 0) {
        fprintf(stderr, "clone3: %s\n", strerror(errno));
        return 3;
    }
    if (pid == 0) {
        while (read(0, &c, 1) > 0) {
        }
        _exit(0);
    }
    printf("%ld\n", pid);
    fflush(stdout);
    waitpid((pid_t)pid, NULL, 0);
    return 0;
}
"""

EBPF_PROBLEM = ebpf.probe() if os.path.exists(ebpf.OBJ_PATH) else None
SOURCES = [
    pytest.param(
        "ebpf",
        marks=pytest.mark.skipif(EBPF_PROBLEM is not None, reason=f"no eBPF: {EBPF_PROBLEM}"),
    ),
    "netlink",
    "poll",
]


def _take_pid_binary() -> str:
    digest = hashlib.sha256(_TAKE_PID_C.encode()).hexdigest()[:16]
    path = os.path.join(tempfile.gettempdir(), f"exitwatch-take-pid-{digest}")
    if not os.path.exists(path):
        src = f"{path}.{os.getpid()}.c"
        Path(src).write_text(_TAKE_PID_C)
        try:
            subprocess.run(["gcc", "-O1", "-o", f"{path}.{os.getpid()}", src], check=True)
        finally:
            os.unlink(src)
        os.rename(f"{path}.{os.getpid()}", path)  # atomic: parallel runs may race here
    return path


def take_pid(pid: int) -> subprocess.Popen[str]:
    """A live process with pid `pid` (which must be free); close its stdin to end it."""
    proc = subprocess.Popen(
        [_take_pid_binary(), str(pid)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip() == str(pid), proc.stderr.read() if proc.stderr else line
    return proc


@pytest.mark.parametrize("source", SOURCES)
def test_a_dead_owners_pid_taken_at_once_is_reaped_through_the_exit_hint(
    engine, workroot, tmp_path, source
):
    interval = "0.5" if source == "poll" else "3600"
    argv = agent_argv(source, engine.host, workroot, extra=("--poll-interval", interval))
    agent = Agent(argv, tmp_path / "agent.log")
    owner = spawn_owner()
    impostor = None
    try:
        agent.wait_log("ready:")
        cid = container(engine, owner.pid)
        path = workroot / "w"
        path.mkdir()
        mark_workdir(path, owner.pid)
        agent.wait_holding(owner.pid, containers=1, workdirs=1)

        kill(owner)  # and waited for: the pid is free
        impostor = take_pid(owner.pid)
        assert owner_of(owner.pid).starttime != owner.owner.starttime
        assert death(owner.owner) == "pid reused (start time differs)"
        wait_gone(engine, [cid], [path])
        # Judged by the exit hint: the log says how it died.
        needle = f"reaped container {cid[:12]}"
        agent.wait_log(needle)
        line = next(x for x in agent.text().splitlines() if needle in x)
        if source != "poll":  # the hint carries the wait status; a poll may not see it
            assert "killed by SIGKILL" in line.split("death=", 1)[1]
        assert not exists(engine, cid)
    finally:
        agent.stop()
        if impostor is not None:
            impostor.communicate(timeout=30)
