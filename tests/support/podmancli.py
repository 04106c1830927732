"""The podman CLI's commands that must answer the same directly and through a labelling
socket (exitwatch run's, adopt's): streams, exec, attach, logs, events, on a container made
directly (engine/test_run_podman.py, engine/test_adopt_podman.py)."""

from __future__ import annotations

import subprocess
import time

from support.procs import wait_for

SAME = r"""
podman ps -a --filter name=fixed --format '{{.Names}} {{.Command}} {{.Image}}'
podman inspect --format '{{.Name}} {{.Config.Cmd}} {{.State.Running}}' fixed
podman logs fixed
podman exec fixed sh -c 'echo exec-out; echo exec-err >&2; exit 3'; echo "exec: $?"
echo stdin-data | podman exec -i fixed cat
podman run --rm $IMAGE sh -c 'echo attached; echo attached-err >&2; exit 4'; echo "run: $?"
echo piped | podman run --rm -i $IMAGE cat
podman events --stream=false --since "$SINCE" --filter container=fixed --format '{{.Status}}' |
    grep -v exec  # each path's own execs come after the start
podman top fixed pid args | wc -l
"""


def fixed(podman) -> dict[str, str]:
    """Make the container `fixed` directly, its first lines logged; the variables SAME
    needs (IMAGE, SINCE)."""
    since = time.time() - 1
    podman.podman(
        "run", "-d", "--name", "fixed", podman.image, "sh", "-c",
        "echo out1; echo err1 >&2; exec sleep 1000",
    )  # fmt: skip
    wait_for(lambda: "out1" in podman.podman("logs", "fixed").stdout, what="fixed's first line")
    return {"IMAGE": podman.image, "SINCE": f"{since:.0f}"}


def assert_same(
    direct: subprocess.CompletedProcess[str], proxied: subprocess.CompletedProcess[str]
) -> None:
    """SAME's outputs directly and through a socket: the same, and what they should be."""
    assert proxied.returncode == direct.returncode == 0, proxied.stderr
    assert "exec-out\nexec: 3\nstdin-data\nattached\nrun: 4\npiped\n" in direct.stdout
    assert "\ncreate\ninit\nstart\n" in direct.stdout  # fixed's events
    assert proxied.stdout == direct.stdout
    assert proxied.stderr == direct.stderr
    assert "attached-err" in direct.stderr and "exec-err" in direct.stderr
