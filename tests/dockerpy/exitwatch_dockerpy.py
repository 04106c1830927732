"""A pytest plugin loaded into docker-py's own test run (`-p exitwatch_dockerpy`, by
tests/dockerpy/check.py): it skips what needs what the private engine has not, and writes
each test's outcome, and when it ran, to the JSON file DOCKERPY_OUTCOMES names.

It runs on the throwaway venv's python, with docker-py's tests, never with exitwatch: it
imports nothing but pytest and the standard library.

What is skipped, and why (the private engine has no registry, no swarm, no network out):
- a whole file, by SKIP_FILES;
- a test whose own source (or its class's setUp) has what SKIP_SOURCE lists: a call that
  needs a registry or swarm, or an image name that only a registry can answer for.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import time

import pytest

SKIP_FILES = {
    "api_swarm_test.py": "needs swarm mode",
    "api_service_test.py": "needs swarm mode (services)",
    "api_secret_test.py": "needs swarm mode (secrets)",
    "api_config_test.py": "needs swarm mode (configs)",
    "models_swarm_test.py": "needs swarm mode",
    "models_services_test.py": "needs swarm mode (services)",
    "models_nodes_test.py": "needs swarm mode (nodes)",
    "api_plugin_test.py": "installs plugins from Docker Hub (needs network access)",
}
SKIP_DIRS = {
    "credentials": "credentials/: needs docker-credential-pass, gpg and a store",
}
SKIP_SOURCE = {
    ".pull(": "pulls from Docker Hub (needs network access and a registry)",
    "inspect_distribution(": "asks Docker Hub for an image's distribution data (network)",
    "get_registry_data(": "asks Docker Hub for an image's registry data (network)",
    "dockerpytest_does_not_exist": "runs a missing image, which the engine then pulls (network)",
    ".push(": "pushes to a registry",
    ".login(": "logs in to a registry",
    "init_swarm(": "needs swarm mode",
}


def _source(item: pytest.Item) -> str:
    parts = []
    for obj in (getattr(item, "function", None), getattr(item.cls, "setUp", None)):
        if obj is None:
            continue
        with contextlib.suppress(OSError, TypeError):
            parts.append(inspect.getsource(obj))
    return "\n".join(parts)


def skip_reason(item: pytest.Item) -> str | None:
    path = item.path
    if path.name in SKIP_FILES:
        return SKIP_FILES[path.name]
    for part in path.parts:
        if part in SKIP_DIRS:
            return SKIP_DIRS[part]
    source = _source(item)
    for text, reason in SKIP_SOURCE.items():
        if text in source:
            return reason
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        reason = skip_reason(item)
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=f"exitwatch check: {reason}"))


_outcomes: dict[str, dict[str, str]] = {}
_times: dict[str, dict[str, float]] = {}  # when each test began and ended, for check.py


def pytest_runtest_logstart(nodeid: str) -> None:
    _times[nodeid] = {"start": time.time()}


def pytest_runtest_logfinish(nodeid: str) -> None:
    _times.setdefault(nodeid, {})["stop"] = time.time()


def _detail(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple):  # a skip: (file, line, reason)
        return str(longrepr[2])
    return str(longrepr or "")[-1500:]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """One outcome per test: failed in the call, error in setup or teardown, skipped,
    xfailed or xpassed, else passed."""
    was_xfail = hasattr(report, "wasxfail")
    current = _outcomes.get(report.nodeid, {}).get("outcome")
    if report.failed:
        outcome = "failed" if report.when == "call" else "error"
        if current in ("failed", "error"):
            return  # a teardown error after a failure: the failure says more
        _outcomes[report.nodeid] = {"outcome": outcome, "detail": _detail(report)}
    elif report.skipped:
        if current is None:
            outcome = "xfailed" if was_xfail else "skipped"
            _outcomes[report.nodeid] = {"outcome": outcome, "detail": _detail(report)}
    elif report.when == "call" and current is None:
        _outcomes[report.nodeid] = {"outcome": "xpassed" if was_xfail else "passed"}


def pytest_sessionfinish(session: pytest.Session) -> None:
    where = os.environ.get("DOCKERPY_OUTCOMES")
    if not where or hasattr(session.config, "workerinput"):
        return  # an xdist worker: the controller gets its reports and writes them all
    found = {test: {**r, **_times.get(test, {})} for test, r in _outcomes.items()}
    with open(where, "w") as f:
        json.dump(found, f, indent=1, sort_keys=True)
