"""adopt's walk remembers what one exec of a process cannot change (its pid namespace and
command line), by pid, start time and environment area; a new exec is read afresh, and a
parent's death is seen at once (peers.Adopting._read, procfs.lineage)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from exitwatch import procfs
from exitwatch.adopt.peers import Adopting
from exitwatch.engine.url import Endpoint

from support.procs import wait_for

ENGINE = Endpoint.parse("unix:///nonexistent/docker.sock")


def test_lineage_agrees_with_stat() -> None:
    st = procfs.read_stat(os.getpid())
    start, env_start, env_end, ppid, pgrp = procfs.lineage(os.getpid())
    assert (start, ppid, pgrp) == (st.starttime, st.ppid, st.pgrp)
    assert (env_start, env_end) == (st.env_area or (0, 0))


def test_a_process_that_execs_is_read_again() -> None:
    adopting = Adopting(["sleep 100"], ENGINE)
    proc = subprocess.Popen(
        ["sh", "-c", "read x; exec sleep 100", "exitwatch-before"],
        stdin=subprocess.PIPE,
    )
    try:
        wait_for(
            lambda: Path(f"/proc/{proc.pid}/cmdline").read_bytes().endswith(b"exitwatch-before\0"),
            timeout=10,
            what="sh's own exec",
        )
        first = adopting._read(proc.pid)
        assert first.line.endswith("exitwatch-before")
        assert adopting.identify(proc.pid) is None  # nothing matches, on the host: nobody
        assert adopting._read(proc.pid) == first  # the same exec: as remembered
        proc.stdin.write(b"go\n")
        proc.stdin.flush()
        wait_for(
            lambda: Path(f"/proc/{proc.pid}/cmdline").read_bytes().startswith(b"sleep"),
            timeout=10,
            what="the exec",
        )
        again = adopting._read(proc.pid)
        assert again.start == first.start and again.line == "sleep 100"
        found = adopting.identify(proc.pid)
        assert found is not None and found.owner.endswith(f":{proc.pid}:{first.start}")
    finally:
        proc.kill()
        proc.wait()


def test_a_parent_is_read_each_time() -> None:
    """The parent (and so the walk) is never taken from what was remembered: a child whose
    parent died is seen reparented at once."""
    adopting = Adopting([], ENGINE)
    parent = subprocess.Popen(
        ["sh", "-c", "sleep 100 >/dev/null & echo $!; read x"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    child = int(parent.stdout.readline())
    try:
        assert adopting._read(child).ppid == parent.pid
        parent.communicate("\n")
        wait_for(lambda: adopting._read(child).ppid != parent.pid, timeout=10, what="reparenting")
    finally:
        os.kill(child, 9)
