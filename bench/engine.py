"""The benchmark's own engines (a Docker from tests/support/engine.sh, or a rootful podman from
tests/support/podman.sh), containers made in bulk, and the engine's destroy events: the
outside clock that says when a container is gone."""

from __future__ import annotations

import contextlib
import os
import pwd
import subprocess
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import docker
import docker.errors

from bench.eventsfile import EventsFile
from bench.gone import Seen
from exitwatch.contract import LABEL_OWNER
from exitwatch.owner import Owner

SUPPORT = Path(__file__).resolve().parent.parent / "tests" / "support"
ENGINE_SH = SUPPORT / "engine.sh"
PODMAN_SH = SUPPORT / "podman.sh"
ROOTLESS_SH = SUPPORT / "rootless.sh"
IMAGE = "exitwatch-test/busybox:latest"
FLOOR_LABEL = "exitwatch.bench"  # floor containers: the same kind, but nobody's
THREADS = 16


class Engine:
    """`kind` "docker" (engine.sh) or "podman" (podman.sh) in `directory`; with `user`, that
    user's rootless podman (rootless.sh), whose containers have no network (rootless.sh
    says why)."""

    def __init__(self, directory: str, kind: str = "docker", user: str | None = None) -> None:
        self.dir, self.kind, self.user = directory, kind, user
        # podman sends `remove` where Docker sends `destroy` (docs/podman.md)
        self.gone_event = "remove" if kind == "podman" else "destroy"
        done = subprocess.run(self._argv("start"), capture_output=True, text=True, check=False)
        if done.returncode != 0:
            said = done.stderr.strip()
            raise RuntimeError(f"{' '.join(self._argv('start'))} failed: {said}")
        self.host = done.stdout.strip()
        self.api = docker.APIClient(base_url=self.host, timeout=300, max_pool_size=THREADS * 2)
        self.version = self.api.version()["Version"]
        self._host_config = self.api.create_host_config(network_mode="none") if user else None
        self.clean()

    def _argv(self, verb: str) -> list[str]:
        """The script's command line for `verb` (start, stop, purge) of this engine."""
        if self.user is not None:  # rootless.sh VERB ENGINE USER DIR; purge USER DIR
            kind = [self.kind] if verb != "purge" else []
            return [str(ROOTLESS_SH), verb, *kind, self.user, self.dir]
        if self.kind == "docker":
            script, socket = ENGINE_SH, "docker.sock"
        else:
            script, socket = PODMAN_SH, "podman.sock"
        start = [os.path.join(self.dir, socket)] if verb == "start" else []
        return [str(script), verb, self.dir, *start]

    def destroyed(self) -> Destroyed | EventsFile:
        """The clock that says when a container is gone: the events stream on Docker,
        podman's events file on podman (eventsfile.py says why), which is below the
        runtime directory of a user's (the default tmp_dir, $XDG_RUNTIME_DIR/libpod/tmp)."""
        if self.kind != "podman":
            return Destroyed(self)
        if self.user is None:
            return EventsFile(os.path.join(self.dir, "tmp", "events", "events.log"))
        uid = pwd.getpwnam(self.user).pw_uid
        return EventsFile(f"/run/user/{uid}/libpod/tmp/events/events.log")

    def env(self) -> dict[str, str]:
        """For the docker CLI: this engine, nothing else from the caller's DOCKER_* setup."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("DOCKER_")}
        return env | {"DOCKER_HOST": self.host}

    def create(self, n: int, owner: Owner | None = None, start: bool = False) -> list[str]:
        """`n` containers of the test image, labelled with `owner` (or as floor ones)."""
        labels = {LABEL_OWNER: str(owner)} if owner is not None else {FLOOR_LABEL: "floor"}

        def one(_: int) -> str:
            cid = self.api.create_container(IMAGE, labels=labels, host_config=self._host_config)
            cid = cid["Id"]
            if start:
                self.api.start(cid)
            return cid

        with ThreadPoolExecutor(THREADS) as pool:
            return list(pool.map(one, range(n)))

    def create_for(
        self, owners: Iterable[Owner], per_owner: int, start: bool = False
    ) -> dict[Owner, list[str]]:
        owners = list(owners)

        def one(owner: Owner) -> list[str]:
            return [
                self.api.create_container(
                    IMAGE, labels={LABEL_OWNER: str(owner)}, host_config=self._host_config
                )["Id"]
                for _ in range(per_owner)
            ]

        with ThreadPoolExecutor(THREADS) as pool:
            made = dict(zip(owners, pool.map(one, owners), strict=True))
        if start:
            with ThreadPoolExecutor(THREADS) as pool:
                list(pool.map(self.api.start, [c for ids in made.values() for c in ids]))
        return made

    def remove(self, ids: Iterable[str]) -> None:
        def one(cid: str) -> None:
            with contextlib.suppress(docker.errors.NotFound):
                self.api.remove_container(cid, force=True, v=True)

        with ThreadPoolExecutor(THREADS) as pool:
            list(pool.map(one, ids))

    def clean(self) -> None:
        self.remove(c["Id"] for c in self.api.containers(all=True))

    def count(self) -> int:
        return len(self.api.containers(all=True, quiet=True))

    def close(self, purge: bool = False) -> None:
        """Stop the engine; its data (the image) stays for the next run, unless `purge`."""
        self.api.close()
        subprocess.run(self._argv("purge" if purge else "stop"), capture_output=True, check=False)


class Destroyed(Seen):
    """Follows the engine's destroy events; `when(id)` is when one was seen (monotonic)."""

    def __init__(self, engine: Engine) -> None:
        super().__init__()
        self.engine = engine
        self._stream = engine.api.events(
            filters={"type": "container", "event": engine.gone_event}, decode=True
        )
        self._thread = threading.Thread(target=self._follow, daemon=True)
        self._thread.start()
        # The engine answers an events request before it subscribes: a container removed
        # now and seen proves the stream is live.
        probe = engine.create(1)[0]
        engine.remove([probe])
        if not self.wait([probe], 30):
            raise RuntimeError("the engine's events stream did not report a destroy in 30 s")

    def _follow(self) -> None:
        with contextlib.suppress(Exception):  # the stream ends with an error when closed
            for event in self._stream:
                at = time.monotonic()
                with self._cond:
                    self.seen[event.get("id") or event["Actor"]["ID"]] = at
                    self._cond.notify_all()

    def close(self) -> None:
        self._stream.close()
