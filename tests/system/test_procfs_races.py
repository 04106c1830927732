"""/proc readers racing real processes with threads as they exit: only ProcessLookupError,
and death() says "process gone" once they are."""

from __future__ import annotations

import contextlib
import subprocess
import sys

from exitwatch import procfs
from exitwatch.owner import death, owner_of

_THREADS_THEN_EXIT = (
    "import threading, os\n"
    "ts = [threading.Thread(target=os.getpid) for _ in range(8)]\n"
    "[t.start() for t in ts]\n"
    "os._exit(0)\n"
)


def test_readers_racing_exiting_processes_raise_only_process_lookup():
    """Processes with threads exit while every reader runs against them, in a loop."""
    unexpected: list[BaseException] = []
    for _ in range(60):
        child = subprocess.Popen([sys.executable, "-I", "-S", "-c", _THREADS_THEN_EXIT])
        owner = owner_of(child.pid)  # taken at fork, before any exit
        while True:
            try:
                for tid in procfs.thread_ids(child.pid):
                    with contextlib.suppress(ProcessLookupError):
                        procfs.read_stat(child.pid, tid=tid)
                procfs.read_stat(child.pid)
            except ProcessLookupError:
                pass
            except Exception as err:  # anything else is a reader bug
                unexpected.append(err)
                break
            if death(owner) is not None:
                break
        child.wait()
        assert death(owner) == "process gone"
    assert not unexpected, unexpected
