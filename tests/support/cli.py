"""The exitwatch command line as the tests run it: a fresh interpreter of this tree's
package, its output captured; and a shell that tells its own owner, as the README's
examples run the commands."""

from __future__ import annotations

import subprocess
import sys

from exitwatch.owner import Owner, current_boot_id, current_machine_id

EXITWATCH = [sys.executable, "-m", "exitwatch"]


def exitwatch(*args: str, **kw) -> subprocess.CompletedProcess[str]:
    """`exitwatch ARGS` to its end (`kw` to subprocess.run: env, cwd)."""
    return subprocess.run([*EXITWATCH, *args], capture_output=True, text=True, timeout=60, **kw)


def status(sock: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`exitwatch status` asking the agent on `sock` (or scanning, if none answers)."""
    return subprocess.run(
        [*EXITWATCH, "status", "--status-socket", sock, *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


# The shell's own owner string, printed by the shell itself before it exits.
SELF = 'echo "$$ $(cut -d" " -f22 /proc/$$/stat)"'


def sh(script: str, env: dict[str, str] | None = None) -> tuple[str, list[str]]:
    """Run `script` in sh, which prints its own owner last; (that owner, the other lines)."""
    done = subprocess.run(
        ["sh", "-c", f"{script}\n{SELF}"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    *lines, last = done.stdout.strip().splitlines()
    pid, start = last.split()
    return str(Owner(current_boot_id(), int(pid), int(start), current_machine_id())), lines
