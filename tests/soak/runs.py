"""`exitwatch run` runs (root's): CMD creates two containers through the run's socket, one on
a network of its own with a named volume (`-v NAME:/d`, which the socket labels), writes
files in its TMPDIR, and leaves a `setsid` child behind. Half the runs have CMD SIGKILLed,
and the wrapper cleans up; half have the wrapper SIGKILLed, and the agent reaps by label
and markers and kills the leftover. The steady runs keep their socket busy, a `docker run
--rm` every few seconds, so that the wrappers' RSS is sampled on ones that work."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from exitwatch.owner import owner_of

from .actor import Actor, Ground, Owned, View
from .sampling import rss_kib
from support.engine import IMAGE
from support.runs import Proc
from support.wrapper import REPO, RUN

# Tells the soak, in one line, what it made: its pid, TMPDIR, the leftover's pid, the
# socket, the two containers; then stays (or, steady, keeps using its socket).
CMD = r"""
set -e
docker network create "soak-$N" >/dev/null
a=$(docker run -d --network "soak-$N" -v "soak-$N:/d" "$IMAGE")
b=$(docker run -d "$IMAGE")
mkdir "$TMPDIR/sub" && head -c 4096 /dev/urandom >"$TMPDIR/sub/data"
setsid sh -c 'echo $$ >"$TMPDIR/leftover"; exec sleep 1000000' </dev/null >/dev/null 2>&1 &
until [ -s "$TMPDIR/leftover" ]; do sleep 0.01; done
echo "$$ $TMPDIR $(cat "$TMPDIR/leftover") ${DOCKER_HOST#unix://} $a $b"
exec >/dev/null
[ -n "$WORK" ] || exec sleep 1000000
set +e
while :; do
    docker run --rm "$IMAGE" true || echo "soak: docker run --rm through the socket failed" >&2
    sleep 5
done
"""
BY_CMD, BY_WRAPPER, STEADY = (
    "run, CMD SIGKILLed",
    "run, wrapper SIGKILLed",
    "run, steady (lives to the end)",
)
EXPECTED_STATUS = {BY_CMD: 128 + signal.SIGKILL, BY_WRAPPER: -signal.SIGKILL}


@dataclass
class Run(Owned):
    proc: subprocess.Popen | None = None
    cmd: Proc | None = None
    leftover: Proc | None = None
    tmpdir: Path | None = None
    sockdir: Path | None = None
    containers: tuple[str, ...] = ()
    net: str = ""  # the network's and the volume's name
    stderr: Path | None = None


class Runs(Actor):
    name = "run"
    live_target = 4
    steady_count = 2
    min_age = 3.0  # the agent lists /proc for leftovers every second: it has seen the run

    def __init__(self, ground: Ground) -> None:
        super().__init__(ground)
        # The caller's TMPDIR and XDG_RUNTIME_DIR: the run's directories land under the
        # agent's root, where it finds them by their markers once the wrapper is killed.
        self.base, self.logs = ground.root / "runs", ground.logs
        self.base.mkdir()
        self.n = 0

    def make(self, steady: bool) -> Run:
        self.n += 1
        row = STEADY if steady else (BY_CMD if self.n % 2 else BY_WRAPPER)
        pythonpath = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
        env = self.ground.env(
            TMPDIR=str(self.base),
            XDG_RUNTIME_DIR=str(self.base),
            PYTHONPATH=pythonpath,
            IMAGE=IMAGE,
            N=str(self.n),
            WORK="1" if steady else "",
        )
        stderr = self.logs / f"run-{self.n}.stderr"
        with stderr.open("wb") as err:
            proc = subprocess.Popen(
                [*RUN, "--", "sh", "-c", CMD],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
            )
        assert proc.stdout is not None
        line = proc.stdout.readline().split()
        proc.stdout.close()
        if len(line) != 6:
            proc.kill()
            proc.wait()
            raise RuntimeError(f"run {self.n} did not start: {stderr.read_text().strip()}")
        cmd, tmpdir, leftover, sock, *containers = line
        return Run(
            name=f"run {self.n} (wrapper {proc.pid})",
            row=row,
            owner=str(owner_of(proc.pid)),  # the start time is fixed at fork
            steady=steady,
            proc=proc,
            cmd=Proc(int(cmd)),
            leftover=Proc(int(leftover)),
            tmpdir=Path(tmpdir),
            sockdir=Path(sock).parent,
            containers=tuple(containers),
            net=f"soak-{self.n}",
            stderr=stderr,
        )

    def end(self, owned: Owned) -> None:
        assert isinstance(owned, Run) and owned.proc is not None and owned.cmd is not None
        owned.died = time.time()
        if owned.row == BY_CMD:
            owned.ended_by = "SIGKILL of CMD"
            os.kill(owned.cmd.pid, signal.SIGKILL)  # its parent waits for it: no reuse yet
        elif owned.row == BY_WRAPPER:
            owned.ended_by = "SIGKILL of the wrapper"
            owned.proc.kill()
            owned.proc.wait()
        else:
            owned.ended_by = "SIGTERM of the wrapper"
            owned.proc.terminate()
            owned.proc.wait(timeout=60)

    def _held(self, owned: Owned, view: View) -> tuple[list[str], list[str]]:
        """(what it holds, what it does not), one phrase each."""
        assert isinstance(owned, Run) and owned.proc and owned.cmd and owned.leftover
        assert owned.tmpdir is not None and owned.sockdir is not None
        things = [(f"container {c[:12]}", c in view.containers) for c in owned.containers]
        things += [
            (f"network {owned.net}", owned.net in view.networks),
            (f"volume {owned.net}", owned.net in view.volumes),
            (f"TMPDIR {owned.tmpdir}", (owned.tmpdir / "sub" / "data").exists()),
            (f"socket directory {owned.sockdir}", owned.sockdir.exists()),
            (f"leftover process {owned.leftover.pid}", not owned.leftover.ended()),
            (f"CMD {owned.cmd.pid}", not owned.cmd.ended()),
            (f"wrapper {owned.proc.pid}", owned.proc.poll() is None),
        ]
        return [w for w, there in things if there], [w for w, there in things if not there]

    def missing(self, owned: Owned, view: View) -> list[str]:
        return [f"{what} is gone" for what in self._held(owned, view)[1]]

    def remains(self, owned: Owned, view: View) -> list[str]:
        held = self._held(owned, view)[0]
        assert isinstance(owned, Run) and owned.tmpdir is not None
        if owned.tmpdir.exists() and f"TMPDIR {owned.tmpdir}" not in held:
            held.append(f"TMPDIR {owned.tmpdir} (its content gone, the directory left)")
        return held

    def contract(self, audit: Sequence[dict]) -> list[str]:
        """Each dead wrapper exited as its end says, and said nothing on stderr (a run that
        made nothing it could not remove says nothing: docs/run.md); the steady runs'
        clients never failed through the socket; the agent's audit log has the removal of
        each SIGKILLed wrapper's leftover: the process kind is host-wide, so on a shared
        machine another agent may have killed it first ("already gone"), and its being
        gone alone proves nothing of this agent's."""
        out = []
        removed = {
            (e["owner"], e["what"].split()[1])
            for e in audit
            if e.get("kind") == "process" and e.get("ok") and not e.get("dry_run")
        }
        for owned in self.dead:
            assert isinstance(owned, Run) and owned.leftover is not None
            if owned.row == BY_WRAPPER and (owned.owner, str(owned.leftover.pid)) not in removed:
                out.append(f"{owned.name}: the agent recorded no removal of its leftover")
        for owned in self.dead + self.steady:
            assert isinstance(owned, Run) and owned.proc is not None and owned.stderr
            status = owned.proc.poll()
            if not owned.steady and status != EXPECTED_STATUS[owned.row]:
                out.append(f"{owned.name} ({owned.ended_by}): exited {status}")
            said = [
                line
                for line in owned.stderr.read_text(errors="replace").splitlines()
                if line.startswith(("exitwatch run: ", "soak: "))
            ]
            out += [f"{owned.name}: {line}" for line in said]
        return out

    def rss(self) -> dict[str, int]:
        with self._lock:
            steady, live = list(self.steady), list(self.live)
        out = {}
        for column, runs in (("steady wrappers", steady), ("other wrappers", live)):
            sizes = [rss_kib(r.proc.pid) for r in runs if isinstance(r, Run) and r.proc]
            sizes = [s for s in sizes if s is not None]
            if sizes:
                out[f"{column}, max RSS (KiB)"] = max(sizes)
        return out


def actors(ground: Ground) -> list[Actor]:
    return [Runs(ground)]
