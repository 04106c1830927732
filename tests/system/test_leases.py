"""Leases end to end: a real agent runs them on schedule as their user while their owner
lives, never after it died; and the remote-sandbox pattern of docs/hooks.md against a
stand-in provider on 127.0.0.1 whose sandboxes expire on their own timer: the lease keeps
one alive, SIGKILL deletes it within a second, and it expires once the lease stops with the
agent."""

from __future__ import annotations

import errno
import itertools
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from recipes.page import blocks

from exitwatch.owner import owner_of

from support.alive import Runner, engineless_agent
from support.procs import kill, spawn_owner, wait_for
from support.users import attacker_user

DEADLINE = 30.0


class Provider:
    """A stand-in for a sandbox provider's HTTP API, as docs/hooks.md's plain HTTP recipe
    calls it: each sandbox expires `ttl` seconds after it was made or last renewed (POST
    /sandboxes/NAME/timeout; the timeout the request asks for is not honoured, so that a
    test's sandbox lives seconds, not minutes); DELETE /sandboxes/NAME deletes it. A
    sandbox expired or deleted answers 404 to both; a request without the bearer token,
    401."""

    def __init__(self) -> None:
        self.expires: dict[str, float] = {}  # name -> monotonic time it expires
        self.deleted: dict[str, float] = {}
        self.keepalives: dict[str, list[float]] = {}
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, code: int) -> None:
                self.send_response(code)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_POST(self) -> None:
                name = self.path.split("/")[2]
                length = int(self.headers.get("Content-Length", 0))
                self.rfile.read(length)
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    return self._answer(401)
                with outer.lock:
                    outer.keepalives.setdefault(name, []).append(time.monotonic())
                    if not outer.alive(name):
                        return self._answer(404)
                    outer.expires[name] = time.monotonic() + outer.ttl[name]
                self._answer(200)

            def do_DELETE(self) -> None:
                name = self.path.split("/")[2]
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    return self._answer(401)
                with outer.lock:
                    if not outer.alive(name):
                        return self._answer(404)
                    outer.deleted[name] = time.monotonic()
                self._answer(204)

            def log_message(self, *args: object) -> None:
                pass

        self.ttl: dict[str, float] = {}
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/sandboxes"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def create(self, name: str, ttl: float) -> None:
        with self.lock:
            self.ttl[name] = ttl
            self.expires[name] = time.monotonic() + ttl

    def alive(self, name: str) -> bool:
        return name not in self.deleted and time.monotonic() < self.expires.get(name, 0.0)

    def kept(self, name: str) -> list[float]:
        with self.lock:
            return list(self.keepalives.get(name, []))

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def provider() -> Iterator[Provider]:
    service = Provider()
    yield service
    service.close()


TOKEN = "t0ken-of-the-test"


def recipe(url: str, name: str) -> str:
    """A runner that runs docs/hooks.md's plain HTTP recipe as the page has it (its lease
    every second rather than every minute), then waits to be killed."""
    [block] = blocks("Plain HTTP")
    assert "every=60" in block
    block = block.replace("every=60", "every=1")
    head = f"import exitwatch\napi, sandbox_id, token = {url!r}, {name!r}, {TOKEN!r}\n"
    return head + block + "\nready()\ntime.sleep(3600)\n"


def test_a_sandbox_lives_by_its_lease_and_goes_within_a_second_of_sigkill(
    alive_agent, alive_spools, provider, tmp_path
):
    provider.create("sbx", ttl=2.5)
    runner = Runner(recipe(provider.url.removesuffix("/sandboxes"), "sbx"), alive_spools, tmp_path)
    try:
        wait_for(lambda: runner.said("ready"), DEADLINE, "the runner's lease and hook")
        # Past its timer more than once over: alive only by its lease.
        wait_for(lambda: len(provider.kept("sbx")) >= 5, DEADLINE, "five keepalives")
        assert provider.alive("sbx")
        killed = time.monotonic()
        runner.kill()
        wait_for(lambda: "sbx" in provider.deleted, DEADLINE, "the DELETE")
        assert provider.deleted["sbx"] - killed <= 1.0
        # No keepalive was made once the runner was dead (one under way was killed).
        assert all(t <= killed + 0.05 for t in provider.kept("sbx")), provider.kept("sbx")
        wait_for(lambda: not os.listdir(alive_spools.leases), DEADLINE, "the lease removed")
        health = alive_agent.status()["leases"]
        assert health["runs"] >= 5 and health["failures"] == 0
    finally:
        runner.kill()


def test_a_sandbox_expires_on_its_own_timer_once_the_lease_stops_with_the_agent(
    alive_agent, alive_spools, provider, tmp_path
):
    provider.create("sbx2", ttl=2.5)
    runner = Runner(recipe(provider.url.removesuffix("/sandboxes"), "sbx2"), alive_spools, tmp_path)
    try:
        wait_for(lambda: len(provider.kept("sbx2")) >= 3, DEADLINE, "three keepalives")
        alive_agent.stop()  # the host's agent is gone (or the host): nobody keeps it alive now
        stopped = time.monotonic()
        wait_for(lambda: not provider.alive("sbx2"), 2.5 + 1.5, "the sandbox to expire")
        assert "sbx2" not in provider.deleted  # expired, not deleted
        assert all(t <= stopped for t in provider.kept("sbx2"))
        # The runner dies while no agent runs; the next agent runs its hook, which finds
        # the sandbox gone (404): done, and the hook goes.
        runner.kill()
        again = engineless_agent(alive_spools, tmp_path)
        try:
            wait_for(lambda: not os.listdir(alive_spools.hooks), DEADLINE, "the hook done")
            audit = Path(again.flag("--audit-log")).read_text().splitlines()
            [ran] = [json.loads(a) for a in audit if json.loads(a)["kind"] == "hook"]
            assert ran["ok"] and ran["extra"]["hook"]["returncode"] == 0
        finally:
            again.stop()
    finally:
        runner.kill()


# Each run writes its uid, its owner and when it ran (the monotonic clock) to a file.
SCHEDULE = """
now = 'import time; print(time.monotonic())'
run = 'echo "$(id -u) $EXITWATCH_LEASE_OWNER $(python3 -c "$1")" >> "$0"'
lease = alive.while_alive(["sh", "-c", run, {path!r}, now], every=1)
ready()
time.sleep(3600)
"""


def test_a_lease_runs_on_schedule_as_its_user_and_never_after_its_owner_died(
    alive_agent, alive_spools, tmp_path
):
    user = attacker_user()
    where = alive_spools.top  # a directory the user can reach
    runs, witness = where / "runs", where / "witness"
    for path in (runs, witness):
        path.touch()
        os.chmod(path, 0o666)
    runner = Runner(SCHEDULE.format(path=str(runs)), alive_spools, where, user=user)
    clock = Runner(SCHEDULE.format(path=str(witness)), alive_spools, where)  # root's, lives on
    try:
        wait_for(lambda: runner.said("ready") and clock.said("ready"), DEADLINE, "the leases")
        owner = str(owner_of(runner.pid))
        wait_for(lambda: len(runs.read_text().splitlines()) >= 4, DEADLINE, "four runs")
        killed = time.monotonic()
        runner.kill()
        # The witness's lease runs every second: three more of its runs are time enough for
        # a run of the dead owner's lease to have shown.
        seen = len(witness.read_text().splitlines())
        wait_for(lambda: len(witness.read_text().splitlines()) >= seen + 3, DEADLINE, "3 more")
        lines = [line.split() for line in runs.read_text().splitlines()]
        assert {(uid, who) for uid, who, _ in lines} == {(str(user.pw_uid), owner)}
        times = [float(t) for _, _, t in lines]
        assert all(t <= killed + 0.05 for t in times), (times, killed)
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert all(0.8 <= gap <= 1.6 for gap in gaps), gaps
        wait_for(
            lambda: len(os.listdir(alive_spools.leases)) == 1, DEADLINE, "only the witness's left"
        )
    finally:
        runner.kill()
        clock.kill()


def test_a_failing_lease_is_counted_shown_and_said_once(alive_agent, alive_spools, tmp_path):
    runner = Runner(
        'alive.while_alive(["sh", "-c", "echo nope; exit 3"], every=1)\nready()\ntime.sleep(3600)',
        alive_spools,
        tmp_path,
    )
    try:
        wait_for(
            lambda: alive_agent.status()["leases"]["failures"] >= 3, DEADLINE, "three failures"
        )
        health = alive_agent.status()["leases"]
        assert health["failing"] == 1 and "exited with code 3" in health["last_failure"]
        assert alive_agent.text().count("failed: exited with code 3") == 1  # once per streak
        assert "'nope\\n'" in alive_agent.text()
        runner.proc.send_signal(signal.SIGKILL)
        wait_for(lambda: alive_agent.status()["leases"]["leases"] == 0, DEADLINE, "the lease gone")
    finally:
        runner.kill()


def test_a_lease_never_runs_while_its_owner_cannot_be_read(
    alive_spools, tmp_path, monkeypatch, caplog
):
    """EMFILE when the agent opens the owner's pidfd: whether it lives is not known, so the
    lease does not run; that is said once, and counted; once it can be read, it runs."""
    from exitwatch import while_alive
    from exitwatch.kinds.leases import kind as leases

    owner = spawn_owner()
    ran = tmp_path / "ran"
    try:
        while_alive(["touch", str(ran)], every=1, pid=owner.pid)
        real, blind = leases.owners.pidfd, threading.Event()
        blind.set()

        def pidfd(who):
            if blind.is_set():
                raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
            return real(who)

        monkeypatch.setattr(leases.owners, "pidfd", pidfd)
        kind = leases.Leases(str(alive_spools.leases))
        kind.start(lambda change: None)
        try:
            wait_for(lambda: kind.health()["unreadable"] >= 3, DEADLINE, "three runs not made")
            assert not ran.exists() and kind.health()["runs"] == 0
            said = [r.getMessage() for r in caplog.records if "it does not run" in r.getMessage()]
            assert len(said) == 1 and "Too many open files" in said[0]
            blind.clear()
            wait_for(ran.exists, DEADLINE, "a run once the owner can be read")
            # Counted once the run has ended, a moment after its file appeared.
            wait_for(lambda: kind.health()["runs"] >= 1, DEADLINE, "the run counted")
        finally:
            kind.stop()
    finally:
        kill(owner)
