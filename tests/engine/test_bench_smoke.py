"""The benchmark harness in its smoke mode: it runs end to end and writes well-formed
results. Figures are not judged here; `make bench` is where they mean something."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.engines import purge_user

ROOT = Path(__file__).resolve().parents[2]
ENGINE_SH = ROOT / "tests" / "support" / "engine.sh"
PODMAN_SH = ROOT / "tests" / "support" / "podman.sh"

pytestmark = pytest.mark.engine

SECTIONS = {"latency", "storm", "idle", "scale", "hooks", "watchdog", "wrapper", "adopt", "engines"}
DIST = {"n", "p50", "p95", "p99", "max", "mean"}


@pytest.fixture
def bindir(tmp_path: Path) -> Path:
    for prog in ("forkloop", "cnfloor"):
        subprocess.run(
            ["gcc", "-O2", "-Wall", "-o", str(tmp_path / prog), str(ROOT / "bench" / f"{prog}.c")],
            check=True,
        )
    return tmp_path


@pytest.fixture
def engine_dir() -> Iterator[str]:
    # Short (containerd's socket paths live under it) and this session's own.
    d = f"/tmp/exitwatch-bench-smoke-{os.getpid()}"
    yield d
    subprocess.run([str(ENGINE_SH), "purge", d], check=False, capture_output=True)
    # The engines section's podmans (DIR-p0, ...) and its user's (DIR-rl), which it purges
    # itself unless it was killed.
    for podman in Path("/tmp").glob(f"{Path(d).name}-p*"):
        subprocess.run([str(PODMAN_SH), "purge", str(podman)], check=False, capture_output=True)
    purge_user(f"{d}-rl")


def _dist(d: dict) -> None:
    assert set(d) == DIST or d == {"n": 0}, d


def test_smoke_run_writes_well_formed_results(tmp_path: Path, bindir: Path, engine_dir: str):
    results_path = tmp_path / "results.json"
    docs = tmp_path / "benchmarks.md"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.run",
            "--smoke",
            "--results",
            str(results_path),
            "--docs",
            str(docs),
            "--engine-dir",
            engine_dir,
            "--bindir",
            str(bindir),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(results_path.read_text())

    assert results["schema"] == 1 and results["smoke"] is True
    assert set(results["sections"]) == SECTIONS
    assert set(results["costs"]) == SECTIONS
    assert all(c["wall_s"] >= 0 and c["cpu_s"] >= 0 for c in results["costs"].values())
    failed = {k: v["error"] for k, v in results["sections"].items() if "error" in v}
    assert not failed
    assert results["machine"]["cpus"] == os.cpu_count()

    for r in results["sections"]["latency"]:
        if "unavailable" in r:
            assert r["source"] == "ebpf", r  # netlink and poll run on every test host
            continue
        for key in ("container_ms", "workdir_ms", "floor_api_ms", "floor_cli_ms", "overhead_ms"):
            _dist(r[key])
        assert r["container_ms"]["n"] + r["missed"] == r["trials"]
        # One paired difference per trial that was not missed.
        assert r["overhead_ms"]["n"] == r["container_ms"]["n"]

    for r in results["sections"]["storm"]:
        if "unavailable" in r:
            continue
        assert r["exits"] > r["owners"]
        assert r["container_ms"]["n"] <= r["owners"] and r["missed"] <= r["owners"]
        readers = {"agent", "floor"} | ({"forkstat"} if shutil.which("forkstat") else set())
        assert readers <= set(r["cpu_s_per_100k_exits"])  # every storm has its own
        assert r["events_lost"] >= 0 and r["resyncs"] >= 0
        if r["variant"] == "netlink-nofilter":
            assert r["exit_filter"] is False
            assert "the benchmark turned the exit-only filter off" in r["source_line"]
            assert "< 6.6" not in r["source_line"]
        elif r["variant"] == "netlink":
            assert r["exit_filter"] is True

    idle = results["sections"]["idle"]
    # The bench's agents run as deployed, the process kind on: other `exitwatch run`s on the
    # host are owners it watches too (tests/README.md, "hermetic").
    assert idle["watching"] >= idle["owners"] and idle["rss_mb"] > 0
    scale = results["sections"]["scale"]
    assert scale["reconcile"]["ratio"] > 0 and scale["workdirs"]["ratio"] > 0
    assert scale["bulk"]["ours_s"] is not None and scale["bulk"]["baseline_s"] is not None
    run = results["sections"]["wrapper"]
    assert run["client_failures"] == 0 and run["wrapper_exit"] == 0 and run["wrapper_rss_mb"] > 0
    assert run["stream"]["ratio"] > 0
    for part in ("create_start_ms", "ping_ms"):
        for key in ("direct", "run", "overhead"):
            _dist(run[part][key])
        assert run[part]["overhead"]["n"] == run[part]["direct"]["n"] > 0
    adopt = results["sections"]["adopt"]
    assert adopt["client_failures"] == 0 and adopt["adopt_exit"] == 0 and adopt["cp"]["rss_mb"] > 0
    assert adopt["stream"]["ratio"] > 0 and adopt["list"]["ratio"] > 0
    for part in ("create_start_ms", "ping_ms"):
        for key in ("direct", "adopt", "overhead"):
            _dist(adopt[part][key])
        assert adopt[part]["overhead"]["n"] == adopt[part]["direct"]["n"] > 0

    engines = results["sections"]["engines"]
    assert engines["engines"] == results["sizes"]["engines_count"] >= 2
    for r in (engines["rootful_podman"], engines["rootless_podman"]):
        for key in ("container_ms", "workdir_ms", "floor_api_ms", "floor_cli_ms", "overhead_ms"):
            _dist(r[key])
        assert r["container_ms"]["n"] + r["missed"] == r["trials"]
        assert r["overhead_ms"]["n"] == r["container_ms"]["n"]
        assert r["floor_noise_ms"]["n"] == r["trials"]  # one pair of floors in every trial
        # The agent followed the podman it was given, and found the owners' containers there.
        assert r["watching"] >= r["trials"]
    i = engines["idle"]
    assert len(i["all"]) == len(i["one"]) == len(i["rss_mb_ratios"]) == i["runs"] >= 1
    assert all(x["watching"] >= i["owners"] and x["rss_mb"] > 0 for x in i["all"] + i["one"])
    assert i["rss_mb_ratio"] > 0

    for r in results["sections"]["hooks"]:
        _dist(r["hook_ms"])
        _dist(r["plain_ms"])
        assert r["hook_ms"]["n"] + r["missed"] == r["trials"]

    w = results["sections"]["watchdog"]
    for key in ("late_ms", "kill_ms", "overhead_ms"):
        _dist(w[key])
    assert w["late_ms"]["n"] + w["missed"] == w["trials"] and w["timeout_s"] == 1.0
    assert w["late_ms"]["p50"] > 0  # never before its timeout

    for t in results["targets"]:
        assert set(t) == {"section", "target", "value", "met"}
    # The table went to stdout, and the page was written from the same results.
    assert "MISSED" in done.stdout or "met" in done.stdout
    assert results["started"] in docs.read_text()
