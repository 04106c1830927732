"""The directory the suite makes its own under: one per pass, under /tmp, marked as a workdir
of the process that drives the pass.

A host where exitwatch is installed runs an agent that watches /tmp. The suite's
directories hold markers of owners it killed on purpose, the victims of its attacks among
them, and that agent would rightly reap them under the tests. A valid claim hides what lies
below it, and a live owner's workdir is never removed, so that agent leaves all of it alone
while the pass lives, and reaps what is left should the pass be killed. Each test's own
agents watch roots below this directory and never see its marker.

`TMPDIR` names it, so that `tempfile`, pytest's `tmp_path` and every child of the suite
make their directories there.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import stat
import tempfile
from pathlib import Path

from exitwatch.contract import mark_workdir

log = logging.getLogger(__name__)

ENV = "EXITWATCH_TEST_SCRATCH"


def make() -> Path:
    """Make the directory, marked as this process's, point TMPDIR at it, and have it removed
    when this process exits."""
    # Short: what the tests make below it holds unix sockets, whose paths hold 107 bytes, and
    # `exitwatch run` wants its socket's base under dirs.SOCKET_BASE_MAX.
    top = Path(tempfile.mkdtemp(prefix="exitwatch-t-", dir="/tmp"))
    # Traversable: the tests' unprivileged users work in directories below it.
    os.chmod(top, stat.S_IRWXU | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
    mark_workdir(top)
    os.environ[ENV] = os.environ["TMPDIR"] = str(top)
    tempfile.tempdir = None  # read TMPDIR again
    # At exit, and registered first so that it runs last: pytest 7 cleans its basetemp, which
    # lies below, in an atexit callback of its own.
    atexit.register(_remove, top)
    return top


def _remove(top: Path) -> None:
    """Remove the directory, unless something is still mounted below it: a removal would go
    through the mount into what it shows."""
    with open("/proc/self/mountinfo") as f:
        mounted = [line.split()[4] for line in f if line.split()[4].startswith(f"{top}/")]
    if mounted:
        log.warning("%s kept: %s still mounted below it", top, ", ".join(mounted))
        return
    shutil.rmtree(top, ignore_errors=True)
