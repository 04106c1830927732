"""Fixtures of the engine tests alone."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from support.agentproc import Agent, Agents


@pytest.fixture
def start_agent(engine, workroot, tmp_path):
    """Start real agents (`source`, then extra arguments) on the engine; stopped after."""
    agents = Agents(engine.host, workroot, tmp_path)
    yield lambda source="netlink", *extra: agents.start(*extra, source=source)
    agents.stop()


@pytest.fixture
def agent(engine, tmp_path) -> Iterator[Agent]:
    """One real agent on the engine, ready, with a workdir root of its own; stopped after.
    A module with an agent of other settings defines its own."""
    root = tmp_path / "root"
    root.mkdir()
    agents = Agents(engine.host, root, tmp_path)
    try:
        yield agents.start()
    finally:
        agents.stop()
