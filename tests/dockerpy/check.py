"""docker-py's own integration suite as a standing check of the two proxies (`make
test-dockerpy`; tests/README.md, "docker-py's suite through the proxies").

    python3 tests/dockerpy/check.py [--paths direct,adopt,run] [--workers N] [-k EXPR]

1. docker-py's tests from its source release on PyPI (`pip download --no-binary :all:`),
   cached under build/dockerpy/, with the tests/ of that sdist; DOCKERPY_SOURCE=FILE takes
   them from another source archive (a .tar.gz of docker-py's repository at a tag).
2. A throwaway venv there: pytest, the package itself, its test requirements as far as they
   install from PyPI.
3. A private engine (tests/support/engine.sh) with stand-ins for the images the tests use,
   imported from Debian's busybox-static (no registry).
4. The integration tests three ways: directly against the engine's socket, through
   `exitwatch adopt` (a rule matches the tests' pytest), and under `exitwatch run`, each
   with DOCKER_HOST at its socket, one after the other on the same engine, emptied between.
5. Each test's outcome compared with the direct path's (compare.py), and what each proxied
   path left on the engine without an exitwatch.owner label; a summary line, and a non-zero
   exit on any difference.

Run it as root from the repository (it starts dockerd), with the project's python for
exitwatch (PYTHONPATH is set to this tree).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from compare import (
    ABSENT,
    Difference,
    Result,
    counts,
    differences,
    load,
    reproduced,
    spans,
    summary,
)
from engine import Engine, run

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
CACHE = REPO / "build" / "dockerpy"
VERSION = os.environ.get("DOCKERPY_VERSION", "6.1.3")
PATHS = ("direct", "adopt", "run")
SUITE_FILES = ("tests", "pytest.ini", "requirements.txt", "test-requirements.txt")
TIMEOUT = 180  # seconds, per test (pytest-timeout): a hang is a failure, not a stuck check

# Tests that compare a resource's labels exactly: through either proxy the created
# resource also carries exitwatch.owner (docs/run.md, docs/adopt.md), so they fail there
# and pass directly. compare.py allows that difference only when the failure names the
# label. Each with the reason.
LABEL_EXACT = {
    "tests/integration/api_network_test.py::TestNetworks::test_create_network_with_labels": (
        "asserts the network has exactly one label, the one it set"
    ),
    "tests/integration/models_volumes_test.py::VolumesTest::test_create_get": (
        "asserts the volume's Labels equal the one it set"
    ),
}


def log(msg: str) -> None:
    print(f"dockerpy: {msg}", file=sys.stderr, flush=True)


# -- the suite and its venv ------------------------------------------------------------


def source_archive() -> Path:
    given = os.environ.get("DOCKERPY_SOURCE")
    if given:
        return Path(given).resolve()
    CACHE.mkdir(parents=True, exist_ok=True)
    sdist = CACHE / f"docker-{VERSION}.tar.gz"
    if not sdist.exists():
        log(f"downloading docker=={VERSION}'s sdist")
        run(
            [
                sys.executable, "-m", "pip", "download", "-q", "--no-binary", ":all:",
                "--no-deps", f"docker=={VERSION}", "-d", str(CACHE),
            ]
        )  # fmt: skip
    return sdist


def suite(archive: Path) -> Path:
    """docker-py's tests/ and pytest.ini, out of the archive, in a directory of their own
    (the package itself comes from the venv, never from the archive's docker/)."""
    where = CACHE / f"suite-{archive.name.removesuffix('.tar.gz')}"
    if (where / "tests" / "integration").is_dir():
        return where
    with tarfile.open(archive) as tar:
        members = [
            m for m in tar.getmembers() if "/" in m.name and m.name.split("/", 2)[1] in SUITE_FILES
        ]
        if not any(m.name.split("/")[1] == "tests" for m in members):
            sys.exit(
                f"dockerpy: {archive.name} carries no tests/: docker-py's sdists from 7.0 "
                "on hold the package alone (6.1.3 is the newest that carries them); give a "
                "source archive of the repository at its tag with DOCKERPY_SOURCE=FILE"
            )
        tmp = Path(tempfile.mkdtemp(dir=CACHE))
        if hasattr(tarfile, "data_filter"):  # Python 3.11.4 on; Debian 12's is 3.11.2
            tar.extractall(tmp, members=members, filter="data")
        else:
            tar.extractall(tmp, members=[m for m in members if _inside(m)])
    (top,) = tmp.iterdir()
    shutil.rmtree(where, ignore_errors=True)
    top.rename(where)
    tmp.rmdir()
    return where


def _inside(m: tarfile.TarInfo) -> bool:
    """Whether a member stays inside the directory it is extracted into (what the "data"
    filter checks, for Pythons without it)."""
    names = [m.name] + ([m.linkname] if m.issym() or m.islnk() else [])
    return all(not n.startswith("/") and ".." not in Path(n).parts for n in names)


def venv(suite_dir: Path) -> Path:
    """The throwaway venv for docker-py's tests: its python."""
    where = CACHE / f"venv-{VERSION}"
    py = where / "bin" / "python"
    if (where / ".installed").exists():
        return py
    log(f"making the venv {where}")
    shutil.rmtree(where, ignore_errors=True)
    run(["/usr/bin/python3", "-m", "venv", str(where)])
    pip = [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    # Its own pins where the sdist has them (6.x: requirements.txt, test-requirements.txt),
    # each alone, so that one that no longer installs (flake8's, coverage's) costs only
    # itself; then pytest-timeout and pytest-xdist, and the package.
    wanted: list[str] = []
    for name in ("requirements.txt", "test-requirements.txt"):
        f = suite_dir / name
        if f.exists():
            wanted += [
                line.strip()
                for line in f.read_text().splitlines()
                if line.strip() and not line.startswith("#")
            ]
    if not wanted:  # 7.x: pyproject's extras
        wanted = ["pytest==7.4.2", "pytest-timeout==2.1.0", "paramiko", "websocket-client"]
    skipped = []
    for req in wanted:
        if run([*pip, req], check=False).returncode != 0:
            skipped.append(req)
    run([*pip, "pytest-timeout", "pytest-xdist", f"docker=={VERSION}", *_pins(wanted)])
    if skipped:
        log(f"not installed (they do not install here): {', '.join(skipped)}")
    (where / ".installed").write_text("\n".join(wanted) + "\n")
    return py


def _pins(wanted: list[str]) -> list[str]:
    """The requirements that pin requests and urllib3, so the last install keeps them
    (requests 2.32 broke docker-py before 7.1: 'Not supported URL scheme http+docker')."""
    return [r for r in wanted if r.split("=")[0].strip().lower() in ("requests", "urllib3")]


# -- the three paths -----------------------------------------------------------------------


@contextlib.contextmanager
def adopting(engine: Engine, rule: str, logs: Path) -> Iterator[str]:
    """`exitwatch adopt` in front of the engine, as tests/support/adopt.py starts it; its
    DOCKER_HOST."""
    where = Path(tempfile.mkdtemp(prefix="exitwatch-dpya-", dir="/tmp"))
    listen = where / "docker.sock"
    argv = [sys.executable, "-m", "exitwatch", "adopt", "--docker-host", engine.host]
    argv += ["--listen", str(listen), "--rule", rule]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DOCKER_", "LISTEN_"))}
    env["PYTHONPATH"] = str(REPO)
    logfile = logs / "adopt-service.log"
    logfile.unlink(missing_ok=True)
    with logfile.open("ab") as err:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, env=env, cwd="/"
        )
    try:
        deadline = time.monotonic() + 30
        while "ready: serving" not in logfile.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"dockerpy: exitwatch adopt did not start:\n{logfile.read_text()}")
            time.sleep(0.1)
        yield f"unix://{listen}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(where, ignore_errors=True)


def pytest_argv(py: Path, args: argparse.Namespace, tests: list[str]) -> list[str]:
    argv = [str(py), "-m", "pytest", *(tests or ["tests/integration"]), "-p", "exitwatch_dockerpy"]
    argv += ["-p", "no:cacheprovider", "-q", "--timeout", str(TIMEOUT), "-o", "addopts="]
    if args.workers:
        argv += ["-n", str(args.workers)]
    if args.k:
        argv += ["-k", args.k]
    return argv


def run_path(
    path: str,
    engine: Engine,
    py: Path,
    suite_dir: Path,
    args: argparse.Namespace,
    out: Path,
    tests: list[str] | None = None,
    name: str = "",
) -> tuple[dict[str, Result], float]:
    """Docker-py's tests (all, or `tests`) on `path`: each test's outcome, and the time."""
    name = name or path
    outcomes = out / f"{name}.json"
    outcomes.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DOCKER_", "PYTEST_"))}
    # A HOME of its own, with a ~/.docker/config.json: docker-py's context tests write
    # their contexts beside the config file it finds, or, finding none, in the working
    # directory, where they would outlive the run (and a test that leaves one there fails
    # its neighbours in every later run).
    home = out / f"home-{name}"
    shutil.rmtree(home, ignore_errors=True)
    (home / ".docker").mkdir(parents=True)
    (home / ".docker" / "config.json").write_text("{}\n")
    shutil.rmtree(suite_dir / "contexts", ignore_errors=True)
    env |= {
        "HOME": str(home),
        "DOCKERPY_OUTCOMES": str(outcomes),
        "DOCKER_TEST_API_VERSION": engine.api_version(),
        "PYTHONPATH": str(HERE),
    }
    argv = pytest_argv(py, args, tests or [])
    logfile = out / f"{name}.log"
    start = time.monotonic()
    with contextlib.ExitStack() as stack:
        if path == "direct":
            env["DOCKER_HOST"] = engine.host
        elif path == "adopt":
            rule = f"{py} -m pytest *"
            env["DOCKER_HOST"] = stack.enter_context(adopting(engine, rule, out))
        else:  # run: the wrapper forwards to the caller's DOCKER_HOST, CMD gets its socket
            env["DOCKER_HOST"] = engine.host
            env["PYTHONPATH"] = str(REPO)
            wrapper = [sys.executable, "-m", "exitwatch", "run", "--"]
            argv = [*wrapper, "env", f"PYTHONPATH={HERE}", *argv]
        with logfile.open("w") as f:
            done = subprocess.run(argv, cwd=suite_dir, env=env, stdout=f, stderr=subprocess.STDOUT)
    took = time.monotonic() - start
    tail = logfile.read_text(errors="replace").strip().splitlines()[-1:]
    log(f"{name}: pytest exited {done.returncode} in {took:.0f} s: {' '.join(tail)}")
    if not outcomes.exists():
        sys.exit(f"dockerpy: the {name} run wrote no outcomes; its log: {logfile}")
    return load(outcomes), took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--paths", default=",".join(PATHS))
    parser.add_argument("--workers", type=int, default=0, help="pytest-xdist workers (<= 2)")
    parser.add_argument("-k", default="", help="pytest -k, to run some tests only")
    args = parser.parse_args()
    paths = [p for p in args.paths.split(",") if p]
    if paths[0] != "direct" or not set(paths) <= set(PATHS):
        parser.error(f"--paths: direct first, then any of {PATHS[1:]}")

    # A SIGTERM (make's, a CI's) ends the run through the `finally` below, so the engine
    # is purged, not left running.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    suite_dir = suite(source_archive())
    py = venv(suite_dir)
    out = CACHE / f"results-{VERSION}"
    out.mkdir(parents=True, exist_ok=True)
    engine = Engine()
    try:
        engine.start()
        baseline = engine.snapshot()["images"]
        results: dict[str, dict[str, Result]] = {}
        took: dict[str, float] = {}
        leftovers: dict[str, list[str]] = {}
        for path in paths:
            before = engine.snapshot()
            results[path], took[path] = run_path(path, engine, py, suite_dir, args, out)
            left = engine.left(before)
            log(f"{path}: left on the engine: {', '.join(left) or 'nothing'}")
            if path != "direct":
                leftovers[path] = engine.unlabelled(before, spans(out / f"{path}.json"))
            engine.empty(baseline)
        direct = results["direct"]
        proxied = {p: r for p, r in results.items() if p != "direct"}
        found = differences(direct, proxied, LABEL_EXACT)
        if sum(1 for d in found if not d.allowed) <= MAX_RERUN:
            found = [confirm(d, engine, py, suite_dir, args, out, baseline) for d in found]
    finally:
        engine.purge()
    return report(results, took, leftovers, found)


RERUNS = 3  # times a differing test is run again on each of its two paths
MAX_RERUN = 20  # more differences than this are no flakes: they all count, none is rerun


def confirm(
    d: Difference,
    engine: Engine,
    py: Path,
    suite_dir: Path,
    args: argparse.Namespace,
    out: Path,
    baseline: set[str],
) -> Difference:
    """`d`, unless allowed, with its test run again RERUNS times on the direct path and on
    its own, alone on an emptied engine: flaky unless each rerun gives the same outcomes.
    A test that one path did not run at all is never flaky."""
    if d.allowed or ABSENT in (d.direct.outcome, d.proxied.outcome):
        return d
    reruns: dict[str, list[Result]] = {"direct": [], d.path: []}
    for i in range(RERUNS):
        for path in reruns:
            got, _ = run_path(path, engine, py, suite_dir, args, out, [d.test], f"rerun-{path}-{i}")
            reruns[path].append(got.get(d.test, Result(ABSENT)))
            engine.empty(baseline)
    return reproduced(d, reruns["direct"], reruns[d.path])


def report(
    results: dict[str, dict[str, Result]],
    took: dict[str, float],
    leftovers: dict[str, list[str]],
    found: list[Difference],
) -> int:
    direct = results["direct"]
    proxied = {p: r for p, r in results.items() if p != "direct"}
    for path, outcomes in results.items():
        tally = ", ".join(f"{n} {o}" for o, n in counts(outcomes).items())
        print(f"{path}: {took[path]:.0f} s: {tally}")
    for d in found:
        print(("allowed " if d.allowed else "flaky " if d.flaky else "DIFFERS ") + d.describe())
    for path, left in leftovers.items():
        for what in left:
            print(f"UNLABELLED after the {path} path: {what}")
    passed, failed = summary(direct, proxied, found, leftovers)
    print(f"dockerpy: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
