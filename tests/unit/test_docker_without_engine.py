"""The container kind's parts that need no engine: a kind pointed at a socket nobody
answers on, the lean removal call without an engine, and the streamed JSON listing."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import exitwatch
from exitwatch.kinds.docker import unixhttp
from exitwatch.kinds.docker.engine import EngineError, json_array
from exitwatch.kinds.docker.kind import Containers

from support.procs import wait_for


def test_without_an_engine_ping_says_so_and_scan_raises(tmp_path: Path) -> None:
    nowhere = Containers(f"unix://{tmp_path}/docker.sock")
    problem = nowhere.ping()
    assert problem is not None and str(tmp_path) in problem and "\n" not in problem
    with pytest.raises(EngineError, match=str(tmp_path)):
        nowhere.scan()


def test_stop_ends_the_thread_even_without_an_engine(tmp_path: Path) -> None:
    nowhere = Containers(f"unix://{tmp_path}/docker.sock")
    nowhere.start(lambda change: None)
    wait_for(lambda: nowhere.last_error, what="a failed connection")
    assert not nowhere.connected
    nowhere.stop()
    assert "exitwatch-docker-events" not in {t.name for t in threading.enumerate()}


def test_json_array_yields_items_whatever_the_chunk_boundaries():
    items = [{"Id": str(n), "Names": ["/é-ü-" + "x" * n]} for n in range(50)]
    body = json.dumps(items, ensure_ascii=False).encode()
    for size in (1, 2, 3, 7, 64, len(body)):
        chunks = [body[i : i + size] for i in range(0, len(body), size)]
        assert list(json_array(chunks)) == items
    assert list(json_array([b"[", b"]"])) == []


@pytest.mark.parametrize(
    ("chunks", "why"),
    [
        ([b'[{"Id": "a"}, {"Id": "b'], 'before its closing bracket: \'{"Id": "b\''),
        ([b'{"Id": "a"}]'], "not a JSON array"),
        ([b"[1", b"23]"], "non-object"),
        ([b'[{"Id": "a"}, [{"Id": "b"}]]'], "non-object"),
    ],
)
def test_json_array_refuses_what_is_not_a_whole_listing(chunks, why):
    with pytest.raises(ValueError, match=re.escape(why)):
        list(json_array(chunks))


def test_no_engine_is_an_os_error(tmp_path):
    with pytest.raises(OSError):
        unixhttp.remove_container(str(tmp_path / "none.sock"), "1.41", "x", 1.0)


def test_the_sdk_is_imported_without_setuptools() -> None:
    """Where setuptools' distutils shim is installed, docker-py 5's import of distutils
    would load all of setuptools (kinds/docker/__init__.py); the shim is put back where
    it was, for whatever else the process imports (the SDK's own imports add finders after
    it)."""
    probe = (
        "import sys\n"
        "def shims(): return [type(f).__module__ for f in sys.meta_path]\n"
        "before = shims()\n"
        "import exitwatch.kinds.docker.kind\n"
        "kept = shims()[: len(before)] == before\n"
        "print('setuptools' in sys.modules, 'docker' in sys.modules, kept)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=60,
        env=os.environ | {"PYTHONPATH": str(Path(exitwatch.__file__).parents[1])},
    )
    assert done.stdout.split() == ["False", "True", "True"], done.stderr
