"""What the real-runner tests need beside the runners themselves: an engine with a default
bridge (verifiers runs `docker run --network bridge --publish 127.0.0.1::8000`), and the
image `python:3.11-slim` made offline from busybox and Debian's python3 (3.11 on Debian 12,
3.13 on 13: what the runners run in it works on either).

The engine is tests/support/engine.sh's, started on a bridge this module creates; both are named
after the test session's process, so those of a session that died are purged by the next.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import stat
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from exitwatch.owner import Owner, current_boot_id, death, owner_of

from support.locks import turn
from support.tools import CACHE

ENGINE_SH = Path(__file__).with_name("engine.sh")
# Under /run, which only root writes: in /tmp a user could plant a symlink here for the
# purge (root's rm -rf) to follow. Short: containerd's socket paths live below it.
BASE = Path("/run/exitwatch-runners")
PYTHON_IMAGE = "python:3.11-slim"
PYTHON = os.path.realpath("/usr/bin/python3")  # /usr/bin/python3.X
STDLIB = f"/usr/lib/{Path(PYTHON).name}"
BASH = "/bin/bash"
BRIDGE_PREFIX = "exwr"


@dataclass(frozen=True)
class BridgeEngine:
    dir: Path
    host: str
    bridge: str


def _sh(*argv: str, env: dict[str, str] | None = None, stdin: bytes | None = None) -> str:
    done = subprocess.run(argv, input=stdin, capture_output=True, env=env, timeout=300)
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr!r}")
    return done.stdout.decode()


def _free_subnet() -> str:
    """A /24 in 10.213.0.0/16 that no route of the host's covers (another session's
    bridge has one)."""
    routes = _sh("ip", "-4", "route", "show")
    used = {int(m) for m in re.findall(r"^10\.213\.(\d+)\.0/24", routes, re.MULTILINE)}
    third = next(n for n in range(os.getpid() % 200 + 1, 255) if n not in used)
    return f"10.213.{third}"


def _purge_dead() -> None:
    """The engines and bridges of sessions that died without tearing theirs down."""
    boot = current_boot_id()
    for d in BASE.iterdir() if BASE.is_dir() else ():
        try:
            prefix, pid, start = d.name.split("-")
            session = Owner(boot, int(pid), int(start))
        except ValueError:
            continue  # not a session's: whose it is cannot be told, so it is left
        if prefix == boot[:8] and death(session) is None:
            continue
        subprocess.run([str(ENGINE_SH), "purge", str(d)], capture_output=True, check=False)
        subprocess.run(["ip", "link", "del", f"{BRIDGE_PREFIX}{pid}"], capture_output=True)


@contextlib.contextmanager
def bridge_engine() -> Iterator[BridgeEngine]:
    """A private engine whose default bridge network is a bridge of its own."""
    _purge_dead()
    me = owner_of()
    d = BASE / f"{me.boot_id[:8]}-{me.pid}-{me.starttime}"
    bridge = f"{BRIDGE_PREFIX}{me.pid}"
    subprocess.run(["ip", "link", "del", bridge], capture_output=True, check=False)
    _sh("ip", "link", "add", bridge, "type", "bridge")
    try:
        with turn("bridges"):  # the choice of a free subnet is check-then-act
            _sh("ip", "addr", "add", f"{_free_subnet()}.1/24", "dev", bridge)
        _sh("ip", "link", "set", bridge, "up")
        BASE.mkdir(mode=0o700, exist_ok=True)
        base = os.lstat(BASE)
        if not stat.S_ISDIR(base.st_mode) or base.st_uid != 0:
            raise AssertionError(f"{BASE}: not a directory of root's; refusing to use it")
        d.mkdir(exist_ok=True)
        env = os.environ | {"EXITWATCH_TEST_BRIDGE": bridge}
        try:  # a start that fails half-way leaves a dockerd: purged here, not next session
            host = _sh(str(ENGINE_SH), "start", str(d), str(d / "docker.sock"), env=env)
            host = host.strip()
            python_image(host)
            yield BridgeEngine(d, host, bridge)
        finally:
            subprocess.run([str(ENGINE_SH), "purge", str(d)], capture_output=True, check=False)
    finally:
        subprocess.run(["ip", "link", "del", bridge], capture_output=True, check=False)


def libraries(paths: list[str]) -> set[str]:
    """The shared libraries (and the loader) that `paths` need, as ldd resolves them."""
    libs: set[str] = set()
    for path in paths:
        out = subprocess.run(["ldd", path], capture_output=True, text=True).stdout
        libs.update(re.findall(r"(/\S+) \(0x", out))
    return libs


def _python_rootfs() -> bytes:
    """A tar of busybox and its applets, Debian's python3.X as python3, its shared
    libraries (those of its extension modules too) and its standard library, and bash
    (benchflow's oracle runs `bash solve.sh`)."""
    stdlib = STDLIB
    dynload = [str(p) for p in Path(stdlib, "lib-dynload").glob("*.so")]
    buf = io.BytesIO()
    with tempfile.TemporaryDirectory() as tmp, tarfile.open(fileobj=buf, mode="w") as tar:
        root = Path(tmp)
        (root / "bin").mkdir()
        (root / "tmp").mkdir(mode=0o1777)
        (root / "etc").mkdir()
        shutil.copy2("/bin/busybox", root / "bin/busybox")
        for applet in _sh("/bin/busybox", "--list").split():
            if applet != "busybox":
                (root / "bin" / applet).symlink_to("busybox")
        (root / "etc/passwd").write_text("root:x:0:0:root:/:/bin/sh\n")
        (root / "etc/group").write_text("root:x:0:\n")
        tar.add(root, arcname=".")
        tar.add(PYTHON, arcname="usr/bin/python3")
        tar.add(BASH, arcname="usr/bin/bash")
        for lib in sorted(libraries([PYTHON, BASH, *dynload])):
            tar.add(os.path.realpath(lib), arcname=lib.lstrip("/"))
        tar.add(stdlib, arcname=stdlib.lstrip("/"), filter=_no_caches)
    return buf.getvalue()


def _no_caches(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    return None if "__pycache__" in info.name or "/test/" in info.name else info


def python_image(host: str) -> None:
    """Import `python:3.11-slim` into the engine at `host` unless it is there; the rootfs
    is built once and cached."""
    env = os.environ | {"DOCKER_HOST": host}
    inspect = ["docker", "image", "inspect", PYTHON_IMAGE]
    if subprocess.run(inspect, capture_output=True, env=env).returncode == 0:
        return
    # Named by the python inside; the number is bumped when the rootfs changes.
    cached = CACHE / f"python-slim-{Path(PYTHON).name}-2.tar"
    if not cached.exists():
        cached.parent.mkdir(parents=True, exist_ok=True)
        partial = cached.with_name(f".{cached.name}.{os.getpid()}")
        partial.write_bytes(_python_rootfs())
        os.replace(partial, cached)
    _sh(
        "docker",
        "import",
        "--change",
        "ENV PATH=/usr/bin:/bin",
        "--change",
        'CMD ["python3"]',
        str(cached),
        PYTHON_IMAGE,
        env=env,
    )
