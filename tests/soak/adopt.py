"""`exitwatch adopt`'s runner containers: one adopt service (root's, from the soak's Python)
serves a socket in the soak's temp dir for the soak's engine, and each runner is a container
of the test image with that socket mounted at /var/run/docker.sock and the static docker CLI
mounted in (support.adopt.runner_argv, as tests/engine/test_adopt.py starts them). Each
instance of a runner (each start of its container) makes two sandboxes through the socket,
one with a named volume the engine makes (`-v NAME:/w`), and half the runners a network and
a volume too; then waits. The adopt service owns what an instance makes by its container's
init. A runner is `docker kill`ed (every sandbox of that instance must go), or `docker
restart`ed, by SIGTERM or at once (`-t 0`): the old instance's must go, and the new
instance, which makes its own, is a live owner of its own from then on, until it ends too.
The steady runners keep the socket busy, a `docker run --rm` every few seconds, so that the
service's RSS is sampled on one that works."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import docker.errors

from . import checks
from .actor import Actor, Ground, Owned, View
from .report import spread
from .sampling import rss_kib
from support.adopt import Adopt, init_owner_of, owned_by, runner_argv
from support.engine import IMAGE
from support.procs import run, wait_for

# One instance of a runner: its number is kept in the container's own filesystem, which a
# restart keeps. It tells nothing: the soak waits for its sandboxes by their names.
RUNNER = r"""
n=$(( $(cat /n 2>/dev/null || echo 0) + 1 )); echo $n >/n; p=$PREFIX-$n
if [ -n "$NET" ]; then
    docker network create $p-net >/dev/null
    docker volume create $p-vol >/dev/null
    docker run -d --name $p-a --network $p-net -v $p-vol:/v "$IMAGE" >/dev/null
else
    docker run -d --name $p-a "$IMAGE" >/dev/null
fi
docker run -d --name $p-b -v $p-named:/w "$IMAGE" >/dev/null
trap 'exit 0' TERM
[ -n "$WORK" ] || { sleep 1000000 & wait; exit 0; }
while :; do
    docker run --rm "$IMAGE" true || echo "soak: docker run --rm through adopt failed" >&2
    sleep 5 & wait
done
"""
KILLED, RESTARTED, STEADY = (
    "adopt, runner docker killed",
    "adopt, runner docker restarted (old instance)",
    "adopt, runner steady (lives to the end)",
)
MADE_DEADLINE = 120.0  # s for an instance to make its sandboxes, on a loaded machine


@dataclass
class Runner(Owned):
    container: str = ""  # the runner container's name
    cid: str = ""
    prefix: str = ""  # of its sandboxes' names, with the instance's number
    net: bool = False  # whether its instances make a network and a volume
    instance: int = 1  # which start of its container
    sandboxes: tuple[str, ...] = ()  # container ids
    networks: tuple[str, ...] = ()
    volumes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Restarted:
    """A runner container restarted, whose new instance is not yet an owner of the soak's."""

    container: str
    prefix: str
    instance: int
    net: bool
    at: float  # when, on the monotonic clock


class AdoptRunners(Actor):
    name = "adopt"
    live_target = 4
    steady_count = 2
    min_age = 3.0  # the agent has seen the instance's sandboxes, as a run's leftover

    def __init__(self, ground: Ground) -> None:
        super().__init__(ground)
        self.where = ground.root / "adopt"
        self.adopt: Adopt | None = None
        self.n = 0
        self.restarted: list[Restarted] = []
        self.finishing = False  # new instances are killed, never restarted: the end is near
        self.said: list[str] = []  # what dead runners said on stderr
        self.ready: list[float] = []  # seconds from a start to its instance's sandboxes

    def setup(self) -> None:
        self.where.mkdir()
        engine = Path(self.ground.host.removeprefix("unix://"))
        self.adopt = Adopt(engine, self.where / "docker.sock", self.ground.logs / "adopt.log")
        self.adopt.wait_ready()
        super().setup()

    def make(self, steady: bool) -> Runner:
        assert self.adopt is not None
        began = time.monotonic()
        if self.restarted and not steady:
            again = self.restarted.pop(0)
            name, prefix, instance, net = again.container, again.prefix, again.instance, again.net
            began = again.at
        else:
            self.n += 1
            name, prefix, instance = f"soak-runner-{self.n}", f"soaka{self.n}", 1
            net = self.rng.random() < 0.5
            env = [f"PREFIX={prefix}", f"IMAGE={IMAGE}", f"NET={'1' if net else ''}"]
            env.append(f"WORK={'1' if steady else ''}")
            flags = [f for e in env for f in ("-e", e)]
            argv = runner_argv(self.adopt, name, *flags, IMAGE, "sh", "-c", RUNNER)
            run(["docker", *argv], env=self.ground.env())
        p = f"{prefix}-{instance}"
        sandboxes = self._sandboxes(name, (f"{p}-a", f"{p}-b"))
        self.ready.append(time.monotonic() - began)
        owner = init_owner_of(self.api, name)  # the instance's init, which made them
        if steady:
            row = STEADY
        elif self.finishing:
            row = KILLED
        else:
            row = self.rng.choice((KILLED, RESTARTED))
        return Runner(
            name=f"adopt runner {name} instance {instance} ({owner})",
            row=row,
            owner=owner,
            steady=steady,
            container=name,
            prefix=prefix,
            net=net,
            cid=self.api.inspect_container(name)["Id"],
            instance=instance,
            sandboxes=sandboxes,
            networks=(f"{p}-net",) if net else (),
            volumes=tuple(sorted([f"{p}-named", *([f"{p}-vol"] if net else [])])),
        )

    def _sandboxes(self, runner: str, names: tuple[str, ...]) -> tuple[str, ...]:
        """The ids of the containers `names` once they all run."""

        def running() -> tuple[str, ...]:
            listed = self.api.containers(filters={"name": names[0].rsplit("-", 1)[0]})
            ids = {c["Names"][0].lstrip("/"): c["Id"] for c in listed}
            return tuple(ids[n] for n in names) if all(n in ids for n in names) else ()

        try:
            return wait_for(running, timeout=MADE_DEADLINE, what=f"{runner}'s sandboxes")
        except AssertionError as err:
            said = self.api.logs(runner).decode(errors="replace").strip()
            raise RuntimeError(f"{err}; the runner said: {said}") from None

    def end(self, owned: Owned) -> None:
        assert isinstance(owned, Runner)
        owned.died = time.time()
        if owned.row == RESTARTED:
            sigkill = self.rng.random() < 0.5
            owned.ended_by = "SIGKILL (docker restart -t 0)" if sigkill else "docker restart"
            at = time.monotonic()
            argv = ["docker", "restart", *(["-t", "0"] if sigkill else []), owned.container]
            run(argv, env=self.ground.env())
            again = Restarted(owned.container, owned.prefix, owned.instance + 1, owned.net, at)
            self.restarted.append(again)
            return
        owned.ended_by = "SIGKILL (docker kill)"
        run(["docker", "kill", owned.container], env=self.ground.env())
        self.said += self._said(owned)
        # As a runner started with --rm would be: the engine's list stays short.
        with contextlib.suppress(docker.errors.NotFound):
            self.api.remove_container(owned.cid, force=True)

    def _said(self, owned: Runner) -> list[str]:
        text = self.api.logs(owned.cid, stdout=False).decode(errors="replace")
        return [f"{owned.name}: {line}" for line in text.splitlines() if line.startswith("soak: ")]

    def finish(self) -> None:
        """Every live runner ended, as Actor.finish; and the new instances of those it
        restarted made owners and killed, so that none is left unchecked."""
        self.finishing = True
        super().finish()
        while self.restarted:
            owned = self._made(self.make(False))
            with self._lock:
                self.live.append(owned)
            super().finish()

    def _held(self, owned: Owned, view: View) -> tuple[list[str], list[str]]:
        """(what it holds, what it does not), one phrase each."""
        assert isinstance(owned, Runner)
        things = [(f"sandbox {c[:12]}", c in view.containers) for c in owned.sandboxes]
        things += [(f"network {n}", n in view.networks) for n in owned.networks]
        things += [(f"volume {v}", v in view.volumes) for v in owned.volumes]
        return [w for w, there in things if there], [w for w, there in things if not there]

    def missing(self, owned: Owned, view: View) -> list[str]:
        assert isinstance(owned, Runner)
        gone = [f"{what} is gone" for what in self._held(owned, view)[1]]
        if owned.cid not in view.containers:  # nobody's: never the agent's to remove
            gone.append(f"the runner container {owned.container} is gone")
        return gone

    def remains(self, owned: Owned, view: View) -> list[str]:
        return self._held(owned, view)[0]

    def contract(self, audit: Sequence[dict]) -> list[str]:
        """The service served to the end and logged no error; no runner's client failed
        through it; the agent's audit log has the removal of every dead instance's
        sandboxes, by that instance's owner; and nothing else labelled with a dead
        instance's owner is left (a steady runner's `--rm` ones, say)."""
        assert self.adopt is not None
        out = []
        if self.adopt.proc.poll() is not None:
            out.append(f"the adopt service exited {self.adopt.proc.returncode}")
        out += [f"adopt service: {e.removeprefix('agent ')}" for e in self._log()[1]]
        out += self.said
        for owned in self.steady:
            assert isinstance(owned, Runner)
            out += self._said(owned)
        removed = {
            (e["owner"], e["what"].split()[1])
            for e in audit
            if e.get("kind") == "container" and e.get("ok") and not e.get("dry_run")
        }
        for owned in self.dead:
            assert isinstance(owned, Runner)
            for cid in owned.sandboxes:
                if (owned.owner, cid[:12]) not in removed:
                    out.append(f"{owned.name}: the agent recorded no removal of {cid[:12]}")
            left = {k: v for k, v in owned_by(self.api, owned.owner).items() if v}
            if left:
                out.append(f"leak: {owned.name} (ended by {owned.ended_by}): labelled {left}")
        return out

    def _log(self) -> tuple[dict, list[str]]:
        warnings, errors = checks.agent_log(self.adopt.text() if self.adopt else "")
        return dict(warnings.most_common()), errors

    def close(self) -> None:
        try:
            super().close()
        finally:
            if self.adopt is not None:
                self.adopt.stop()

    def rss(self) -> dict[str, int]:
        size = rss_kib(self.adopt.proc.pid) if self.adopt else None
        return {} if size is None else {"adopt service RSS (KiB)": size}

    def figures(self) -> dict:
        return {"adopt_instance_ready": spread(self.ready), "adopt_warnings": self._log()[0]}


def actors(ground: Ground) -> list[Actor]:
    return [AdoptRunners(ground)]
