"""The fixtures shared across tests/unit, system, engine and runners (tests/README.md says
what each directory needs), above all the private Docker engine (tests/support/engine.sh)
for the tests that ask for the `engine` fixture.

Each test session gets an engine of its own, so sessions running side by side (two Pythons,
two engineers) never remove each other's containers. Its directory is named after the
session's process, so an engine left behind by a session that died is found and purged.

Being the rootdir's conftest, this file also puts tests/ on sys.path: the helpers are
imported as `from support.procs import ...`.
"""

from __future__ import annotations

import logging
import os
import pwd
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

import docker
import docker.errors
import pytest

from exitwatch.contract import ENV_HOOK_DIR
from exitwatch.kinds.docker.kind import Containers
from exitwatch.kinds.spool.entry import ensure_spool
from exitwatch.owner import Owner, owner_of

from support import scratch
from support.agentproc import Agent
from support.alive import Spools, engineless_agent, make_spools
from support.engine import (
    ENGINE_SH,
    IMAGE,
    PrivateEngine,
    PrivatePodman,
    dead_sessions,
    session_dir,
)
from support.procs import kill, run, spawn_owner
from support.rootless import ENGINES, RootlessEngine, RootlessUser, session_user, started
from support.runs import FakeRun
from support.trees import lazy_umount_below
from support.users import attacker_user

# Short: containerd's sockets live under it, and unix socket paths hold at most 107 bytes.
BASE = Path("/tmp/exitwatch-engine")
PODMAN_BASE = Path("/tmp/exitwatch-podman")  # the `podman` fixture's, named alike

log = logging.getLogger(__name__)
E = TypeVar("E", bound=PrivateEngine)


def _purge_dead_sessions(base: Path = BASE, script: Path = ENGINE_SH) -> None:
    """Purge the engines of sessions that died without stopping theirs."""
    for d in dead_sessions(base):
        done = run([str(script), "purge", str(d)], check=False)
        if done.returncode != 0:
            log.warning("could not purge the stale engine in %s: %s", d, done.stderr.strip())


def _private(cls: type[E], base: Path) -> Iterator[E]:
    """An engine of `cls` (its SCRIPT, its SOCKET) of this session's own under `base`,
    with the test image; purged at the end, as those of dead sessions are first."""
    _purge_dead_sessions(base, cls.SCRIPT)
    d = session_dir(base, owner_of())
    d.mkdir(parents=True, exist_ok=True)
    host = run([str(cls.SCRIPT), "start", str(d), str(d / cls.SOCKET)]).stdout.strip()
    client = docker.DockerClient(base_url=host)
    try:
        yield cls(d, host, IMAGE, client)
    finally:
        client.close()
        run([str(cls.SCRIPT), "purge", str(d)])


@pytest.fixture(scope="session")
def engine() -> Iterator[PrivateEngine]:
    """A Docker engine of this session's own, with the test image; stopped at the end."""
    yield from _private(PrivateEngine, BASE)


@pytest.fixture(scope="session")
def podman() -> Iterator[PrivatePodman]:
    """A rootful podman of this session's own (support/podman.sh), serving the Docker API,
    with the test image; purged at the end. Each session, so each xdist worker, has its
    own, as with `engine`. Skipped only where podman is not installed (`make test`
    installs it)."""
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed (apt-get install podman; `make deps` does)")
    yield from _private(PrivatePodman, PODMAN_BASE)


@pytest.fixture(scope="session")
def rootless_user() -> Iterator[RootlessUser]:
    """A real unprivileged user of this session's own, with subordinate ids and a home, for
    rootless engines (support/rootless.py); purged and deleted at the end."""
    with session_user(owner_of()) as user:
        yield user


@pytest.fixture(scope="session")
def rootless_docker(rootless_user: RootlessUser) -> Iterator[RootlessEngine]:
    """The user's rootless dockerd, at /run/user/UID/docker.sock, with the test image."""
    with started(rootless_user, "docker") as engine:
        yield engine


@pytest.fixture(scope="session")
def rootless_podman(rootless_user: RootlessUser) -> Iterator[RootlessEngine]:
    """The user's rootless podman service, at /run/user/UID/podman/podman.sock, with the
    test image."""
    with started(rootless_user, "podman") as engine:
        yield engine


@pytest.fixture(params=ENGINES)
def rootless_engine(request: pytest.FixtureRequest) -> RootlessEngine:
    """Each of the user's rootless engines in turn (the test runs once per engine)."""
    return request.getfixturevalue(f"rootless_{request.param}")


ROOTLESS_ENGINES = tuple(f"rootless_{e}" for e in ENGINES)


@pytest.fixture(autouse=True)
def _engine_clean(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each test that used an engine (the private ones, a user's rootless ones), remove
    what it left there."""
    used = [request.getfixturevalue(f) for f in ("engine", "podman") if f in request.fixturenames]
    yield
    # A rootless engine a test had through `rootless_engine` is known only now.
    used += [request.getfixturevalue(f) for f in ROOTLESS_ENGINES if f in request.fixturenames]
    for one in used:
        one.clean()


# The files that take the longest (30 s to 5 min each in `make test`, its two passes side by
# side; tests/README.md, "Where the time goes"). `make test`'s workers take whole files in
# collection order, so these go first: taken last, one of them would leave a worker running
# on alone.
LONGEST_FIRST = (
    "test_runners.py",
    "test_clock_steps.py",
    "test_docker.py",
    "test_adopt_transparency.py",
    "test_bench_smoke.py",
    "test_deb.py",
    "test_proxy.py",
    "test_faults.py",
    "test_rootless.py",
    "test_run_engine.py",
    "test_agent.py",
    "test_operations.py",
    "test_hook_attacks.py",
    "test_alive_attacks.py",
    "test_hook_files.py",
    "test_workdirs.py",
)


# `make test` runs the suite twice, under the venv's libraries and under Debian's python3 with
# bookworm's (`--pass venv`, `--pass debian`). The files that drive a library's surface run
# in both; those below run in one (tests/README.md, "Two passes"). Without --pass, pytest
# runs everything.
ONE_PASS = {
    "venv": (
        # Once per suite by nature: the installed package runs on /usr/bin/python3 whichever
        # interpreter runs pytest; the runners run in venvs of their own; the bench runs on
        # the venv's python, as `make bench` does.
        "test_deb.py",
        "test_bpf_object.py",
        "test_runners.py",
        "test_runner_in_a_container.py",
        "test_bench_smoke.py",
        # Of the kind below, but here, where they even out the two passes' time: the hook
        # spool's attacks, compose projects under a stepped clock, the agent's faults.
        "test_hook_attacks.py",
        "test_clock_steps.py",
        "test_faults.py",
    ),
    "debian": (
        # What no library of the other pass is under, on the interpreter the .deb runs on:
        # the docker kind, which speaks to the engine with the standard library alone
        # (engine/http.py), its engine calls and the agent end to end, on users' rootless
        # engines too (click's
        # side, the command line, in test_cli_errors.py and test_run.py); and the
        # product's own rules, reached through calls that the files of both passes make
        # too: adopt's transparency (test_proxy.py proves the same proxy, for the run's
        # socket, in both), the attacks on workdirs, hooks and a run's directories, the
        # fuzzed labels and hook files, the operations and the status command
        # (test_cli_errors.py has click's side in both), two machines on one engine.
        "test_docker.py",
        "test_agent.py",
        "test_rootless.py",
        "test_unixhttp.py",
        "test_engine_load.py",
        "test_labelled.py",
        "test_owned_volumes.py",
        "test_adopt_transparency.py",
        "test_attacks.py",
        "test_run_dirs_hijack.py",
        "test_hooks.py",
        "test_fuzz.py",
        "test_workdirs.py",
        "test_hook_files.py",
        # The attacks on leases and watchdogs (1.5 to 2.5 min; both passes' libraries only
        # drive the test's own helpers).
        "test_alive_attacks.py",
        "test_run_dirs.py",
        "test_procfs_races.py",
        "test_operations.py",
        "test_status.py",
        # The docker kind against a real podman (a podman per pass would be one more
        # engine beside the two dockerds, for the same standard-library code).
        "test_podman.py",
        # podman's API through the run's socket and adopt's: the proxy's HTTP that
        # test_proxy.py drives in both, against a podman service of the pass's own.
        "test_run_podman.py",
        "test_adopt_podman.py",
        "test_machines.py",
        # Every engine at once: the podman and rootless ones are the Debian pass's.
        "test_every_engine.py",
    ),
}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--pass",
        dest="suite_pass",
        choices=sorted(ONE_PASS),
        help="the pass of `make test` this is: leaves out the files of the other (ONE_PASS)",
    )


def pytest_configure(config: pytest.Config) -> None:
    # Before any test makes a directory; an xdist worker inherits TMPDIR with its environment.
    if not hasattr(config, "workerinput") and scratch.ENV not in os.environ:
        scratch.make()
    # xdist 3.5 and later hand out the files with the most tests first: 3.8 (the venv's) unless
    # told not to, as here; 3.5 to 3.7 always (Debian 13's 3.6.1); 3.1 (Debian 12's) never.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # `-m "not engine"` then skips every test that needs Docker (or podman, or a user's
    # rootless engines); `-m "not rootless"` those that need a user's rootless engines.
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        rootless = any(name.startswith("rootless_") for name in names)
        if {"engine", "podman"} & names or rootless:
            item.add_marker(pytest.mark.engine)
        if rootless:
            item.add_marker(pytest.mark.rootless)
    if this := config.getoption("suite_pass"):
        others = {name for p, names in ONE_PASS.items() if p != this for name in names}
        if gone := [item for item in items if item.path.name in others]:
            config.hook.pytest_deselected(items=gone)
            items[:] = [item for item in items if item.path.name not in others]
    if os.environ.get("PYTEST_XDIST_WORKER"):  # alone, pytest keeps testpaths' fast-first order
        rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
        items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: files whole


@pytest.fixture
def workroot() -> Iterator[Path]:
    """A fresh workdir root of the test's own, in the scratch directory (support/scratch.py)."""
    root = Path(tempfile.mkdtemp(prefix="exitwatch-root-"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def spool(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A hook spool as the agent makes it (root's, 1733), under a directory anyone may
    search, named to the registering side by EXITWATCH_HOOK_DIR."""
    top = Path(tempfile.mkdtemp(prefix="exitwatch-hooks-"))
    os.chmod(top, 0o755)
    path = top / "hooks"
    ensure_spool(str(path))
    monkeypatch.setenv(ENV_HOOK_DIR, str(path))
    try:
        yield path
    finally:
        shutil.rmtree(top)


@pytest.fixture
def out() -> Iterator[Path]:
    """A directory under /tmp that every user's hooks and lease runs may write to."""
    d = Path(tempfile.mkdtemp(prefix="exitwatch-out-"))
    os.chmod(d, 0o1777)
    try:
        yield d
    finally:
        shutil.rmtree(d)


@pytest.fixture
def alive_spools(monkeypatch: pytest.MonkeyPatch) -> Iterator[Spools]:
    """The hook, lease and watchdog spools as the agent makes them, named to the runner's
    side by the environment."""
    for made in make_spools():
        for name, value in made.env.items():
            monkeypatch.setenv(name, value)
        yield made


@pytest.fixture
def alive_agent(alive_spools: Spools, tmp_path: Path) -> Iterator[Agent]:
    """A real agent (no engine) following the three spools; stopped after."""
    started = engineless_agent(alive_spools, tmp_path)
    yield started
    started.stop()


@pytest.fixture(scope="module")
def dead_owner() -> Owner:
    """The owner string of a process that was spawned and killed."""
    child = spawn_owner()
    owner = owner_of(child.pid)
    kill(child)
    return owner


@pytest.fixture
def live_owner() -> Iterator[Owner]:
    """The owner identity of a real process that lives for the test."""
    child = spawn_owner()
    yield child.owner
    kill(child)


@pytest.fixture
def kind(engine: PrivateEngine) -> Iterator[Containers]:
    """The container kind on this session's engine, stopped after the test."""
    k = Containers(engine.host)
    yield k
    k.stop()


@pytest.fixture
def no_leaked_threads() -> Iterator[None]:
    """Fail a test that leaves a thread running (a source or a kind it did not stop)."""
    before = set(threading.enumerate())
    yield
    left = [t.name for t in set(threading.enumerate()) - before]
    assert not left, f"threads left running: {left}"


@pytest.fixture(scope="session")
def attacker() -> pwd.struct_passwd:
    """The unprivileged user (support/users.py), created if it is missing."""
    return attacker_user()


@pytest.fixture
def victim() -> Iterator[Path]:
    """A root-owned tree outside every root, with a file, a subdirectory and a symlink."""
    top = Path(tempfile.mkdtemp(prefix="exitwatch-victim-"))
    os.chmod(top, 0o755)
    (top / "precious").write_text("do not remove\n")
    (top / "sub" / "deeper").mkdir(parents=True)
    (top / "sub" / "deeper" / "data").write_bytes(os.urandom(256))
    (top / "link").symlink_to("precious")
    try:
        yield top
    finally:
        lazy_umount_below(str(top))
        shutil.rmtree(top)


@pytest.fixture
def bases() -> Iterator[Path]:
    """A short directory standing for the caller's TMPDIR and XDG_RUNTIME_DIR, so that what a
    run leaves when it is SIGKILLed lands there and goes with the test."""
    top = Path(tempfile.mkdtemp(prefix="exitwatch-runbase-"))
    yield top
    shutil.rmtree(top)


@pytest.fixture
def runs() -> Iterator[list[FakeRun]]:
    """The fake runs a test makes (support/runs.py), closed after it."""
    made: list[FakeRun] = []
    yield made
    for fake in made:
        fake.close()
