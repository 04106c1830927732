"""`python -m bench.run --only SECTION --merge`: a section rerun on its own replaces that
section of the results, and keeps the others as they were."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from bench.run import merged

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results.json"


def _results(smoke: bool, **sections: dict) -> dict:
    return {
        "smoke": smoke,
        "started": "then",
        "duration_s": 500.0,
        "sizes": {"adopt_trials": 100, "wrapper_trials": 100},
        "sections": sections,
        "costs": {name: {"wall_s": 1.0, "cpu_s": 1.0} for name in sections},
        "load": {"start": 1.0, "end": 1.0},
    }


def test_a_rerun_section_replaces_its_own_and_keeps_the_others() -> None:
    old = json.loads(RESULTS.read_text())
    rerun = copy.deepcopy(old["sections"]["adopt"])
    rerun["ping_ms"]["overhead"]["p95"] = 0.5
    new = _results(False, adopt=rerun)
    new["started"], new["sizes"]["adopt_trials"] = "now", 200
    out = merged(old, new)
    assert out["sections"]["adopt"] == rerun
    assert out["sections"]["hooks"] == old["sections"]["hooks"]
    assert out["sizes"]["adopt_trials"] == 200
    assert out["sizes"]["wrapper_trials"] == old["sizes"]["wrapper_trials"]
    assert out["merged"]["adopt"]["started"] == "now"
    assert out["merged"]["adopt"]["load"] == {"start": 1.0, "end": 1.0}
    assert out["started"] == old["started"]
    (ping,) = [t for t in out["targets"] if "_ping" in t["target"]]
    assert ping["met"] and ping["value"] == 0.5
    assert old["sections"]["adopt"]["ping_ms"]["overhead"]["p95"] != 0.5  # left as it was


def test_smoke_and_full_sizes_do_not_mix() -> None:
    with pytest.raises(SystemExit):
        merged(_results(False), _results(True))
