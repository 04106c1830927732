"""The exit sources with no W+X memory, as exitwatch.service runs the agent
(MemoryDenyWriteExecute=yes), mimicked with prctl(PR_SET_MDWE) (Linux 6.3).

Debian 12's libffi has no static trampolines: with W+X memory refused, it puts each ctypes
callback in a memfd mapped twice, writable and executable, MAP_SHARED. A forked child then
shares the parent's callbacks: one it frees (a collection in the child) is freed for the
parent too, and the parent's own free of it later is a double free, which libffi's
allocator answers with abort(). That is how the packaged agent died of SIGABRT at start,
0.1 s after its source was picked (tests/systemd: "Fatal Python error: Aborted" while
"Garbage-collecting").
"""

import os
import subprocess
import sys

import pytest

from exitwatch.sources import ebpf

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REASON = ebpf.probe() if os.path.exists(ebpf.OBJ_PATH) else None

# Sets PR_SET_MDWE (PR_MDWE_REFUSE_EXEC_GAIN), which execve keeps, then runs argv[1:].
MDWE = """
import ctypes, os, sys
if ctypes.CDLL(None, use_errno=True).prctl(65, 1, 0, 0, 0) != 0:
    print("no PR_SET_MDWE:", os.strerror(ctypes.get_errno()))
    sys.exit(3)
os.execv(sys.argv[1], sys.argv[1:])
"""

# Collections only where this script makes them, and one in every child forked with Python
# in it (as one comes when the child's allocations cross the threshold): the self-test's
# child made one at most starts of the agent under Debian's python3.11.
PICK = """
import gc, os
gc.disable()
os.register_at_fork(after_in_child=gc.collect)
import ctypes
callback = ctypes.CFUNCTYPE(ctypes.c_int)(lambda: 0)
with open("/proc/self/maps") as f:
    print("shared callbacks:", "/memfd:libffi" in f.read(), flush=True)
from exitwatch.sources import pick
source, why = pick("ebpf", poll_interval=1.0)
source.start(lambda hint: None)
source.stop()
gc.collect()
print("alive after:", why, flush=True)
"""


def under_mdwe(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", MDWE, sys.executable, "-X", "faulthandler", "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.skipif(REASON is not None, reason=f"eBPF unusable here: {REASON}")
def test_picking_ebpf_without_wx_memory_leaves_no_callback_to_free_twice():
    done = under_mdwe(PICK)
    if done.returncode == 3:
        pytest.skip(done.stdout.strip())
    if "shared callbacks: False" in done.stdout:
        pytest.skip("this libffi keeps its callbacks private without W+X memory")
    assert "shared callbacks: True" in done.stdout, done.stdout + done.stderr
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-2000:]}"
    assert "alive after: ebpf: self-test passed" in done.stdout
