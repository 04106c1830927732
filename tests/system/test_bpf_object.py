"""The committed eBPF object: exactly what its source builds to, and carried by every
install path (a wheel, `pip install .`), so that an installed agent runs the ebpf source.
packaging/README.md says why it is committed."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from exitwatch.sources import ebpf

from support.procs import run

ROOT = Path(__file__).resolve().parents[2]
OBJ = ROOT / "exitwatch" / "sources" / "exitwatch.bpf.o"
WHEEL_PATH = "exitwatch/sources/exitwatch.bpf.o"
# The object is committed as Debian 12's clang builds it; another clang emits other bytes.
CLANG_MAJOR = 14
DEBIAN_PY = "/usr/bin/python3"


def _clang_major() -> int | None:
    if shutil.which("clang") is None:
        return None
    out = subprocess.run(["clang", "--version"], capture_output=True, text=True).stdout
    found = re.search(r"clang version (\d+)\.", out)
    return int(found.group(1)) if found else None


def _tree_copy(dest: Path) -> Path:
    """The files a fresh clone has (tracked, or new and not ignored), as pip would see them."""
    listed = run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT
    ).stdout
    tree = dest / "tree"
    for name in filter(None, listed.split("\0")):
        src = ROOT / name
        if src.is_file():
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, tree / name)
    return tree


def test_committed_object_is_what_the_source_builds_to(tmp_path: Path) -> None:
    major = _clang_major()
    if major != CLANG_MAJOR:
        pytest.skip(f"the object is clang {CLANG_MAJOR}'s; this clang is {major}")
    # Built into another directory, so the comparison also proves the build directory does
    # not leak into the object.
    out = tmp_path / "fresh.bpf.o"
    run(
        ["make", "-s", "-B", "-f", "exitwatch/sources/Makefile.bpf", f"BPF_OBJ={out}", "bpf"],
        cwd=ROOT,
    )
    assert out.read_bytes() == OBJ.read_bytes(), (
        "exitwatch/sources/exitwatch.bpf.o is not what exitwatch.bpf.c builds to: "
        "run `make -B bpf` and commit the object"
    )


def test_tracked_by_git() -> None:
    # An ignored object would be missing from every clone, and so from every pip install.
    tracked = run(["git", "ls-files", "--error-unmatch", str(OBJ)], cwd=ROOT, check=False)
    ignored = run(["git", "check-ignore", "-q", str(OBJ)], cwd=ROOT, check=False)
    assert tracked.returncode == 0 or ignored.returncode == 1, "the object is ignored by git"


def test_byte_order_mismatch_is_named(tmp_path: Path) -> None:
    other = tmp_path / "other.bpf.o"
    data = bytearray(OBJ.read_bytes())
    data[5] = 2 if sys.byteorder == "little" else 1  # ELF EI_DATA
    other.write_bytes(bytes(data))
    reason = ebpf.probe(str(other))
    if os.geteuid() != 0 or reason.startswith(("not ", "the kernel", "libbpf")):
        pytest.skip(f"eBPF is refused here before the object is read: {reason}")
    assert "endian bytecode and this host is" in reason, reason


@pytest.mark.skipif(not os.path.exists(DEBIAN_PY), reason="needs Debian's python3")
def test_wheel_and_pip_install_carry_the_object(tmp_path: Path) -> None:
    """Offline: Debian's setuptools builds, the venv sees Debian's docker, click and
    prometheus-client, so nothing is fetched."""
    tree = _tree_copy(tmp_path)
    # Not the tree's package through PYTHONPATH (the Debian run sets it): the installed one.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    venv = tmp_path / "venv"
    run([DEBIAN_PY, "-m", "venv", "--system-site-packages", str(venv)])
    pip = [str(venv / "bin" / "python"), "-m", "pip", "-q", "--disable-pip-version-check"]
    offline = ["--no-deps", "--no-build-isolation", "--no-index"]
    run([*pip, "wheel", *offline, "-w", str(tmp_path / "dist"), str(tree)], cwd=tmp_path, env=env)
    (wheel,) = (tmp_path / "dist").glob("exitwatch-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        assert WHEEL_PATH in zf.namelist(), f"{wheel.name} lacks {WHEEL_PATH}"
        assert zf.read(WHEEL_PATH) == OBJ.read_bytes()

    run([*pip, "install", *offline, str(tree)], cwd=tmp_path, env=env)
    # From outside the tree, so that the installed copy is the one imported.
    script = (
        "from exitwatch.sources import ebpf, pick\n"
        "print(ebpf.OBJ_PATH)\n"
        "source, why = pick('auto', poll_interval=1.0)\n"
        "print(source.name, why, sep='\\n')\n"
    )
    python = str(venv / "bin" / "python")
    out = run([python, "-c", script], cwd=tmp_path, env=env).stdout.splitlines()
    installed = Path(out[0])
    assert installed.is_relative_to(venv), installed
    assert installed.read_bytes() == OBJ.read_bytes()
    reason = ebpf.probe()
    if reason is not None:
        pytest.skip(f"eBPF unusable here ({reason}); the object is installed")
    assert out[1] == "ebpf", f"the installed agent picked {out[1]}: {out[2]}"
