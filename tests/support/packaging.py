"""What the tests of packaging/ share: the Prometheus rules and the Grafana dashboard they
check, and the environment the installed package runs in."""

from __future__ import annotations

import json
from pathlib import Path

from support.procs import run

PACKAGING = Path(__file__).resolve().parents[2] / "packaging"
RULES = PACKAGING / "prometheus" / "exitwatch.rules.yml"
RULES_TEST = PACKAGING / "prometheus" / "exitwatch.rules.test.yml"
DASHBOARD = PACKAGING / "grafana" / "exitwatch.json"
UNIT_SOURCE = PACKAGING / "debian" / "exitwatch.service"  # the agent's unit, as packaged
# What the environment of a root shell on a bench host looks like: no pyenv, no tree.
DEBIAN_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "HOME": "/root"}
PAGES = (  # the man pages the .deb ships
    "exitwatch.8",
    "exitwatch.toml.5",
    "exitwatch-run.1",
    "exitwatch-adopt.8",
    "exitwatch-files.5",
)


def man(path: Path) -> str:
    """The page at `path` as man shows it; fails on any warning of man or groff."""
    done = run(["man", "--warnings", "-l", str(path)], env=DEBIAN_ENV | {"MANPAGER": "cat"})
    assert done.stderr == "", f"{path.name}:\n{done.stderr}"
    return done.stdout


def dashboard_exprs() -> list[str]:
    """The PromQL of every panel of the dashboard."""
    doc = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in doc["panels"] for t in p.get("targets", [])]


def bounding_set(unit: Path | str = UNIT_SOURCE, drop: tuple[str, ...] = ()) -> str:
    """The unit's CapabilityBoundingSet=, less `drop` ("CAP_SYS_PTRACE", ...), as a
    setpriv --bounding-set argument: a process run under it as root holds what the unit
    would give the agent, and nothing more."""
    line = next(
        ln for ln in Path(unit).read_text().splitlines() if ln.startswith("CapabilityBoundingSet=")
    )
    caps = [c for c in line.split("=", 1)[1].split() if c not in drop]
    assert not set(drop) - set(line.split()), f"{drop} not in {line}"
    return ",".join(["-all", *(f"+{c.removeprefix('CAP_').lower()}" for c in caps)])
