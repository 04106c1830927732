"""Fixtures of the engine tests alone."""

from __future__ import annotations

import pytest

from support.agentproc import Agents


@pytest.fixture
def start_agent(engine, workroot, tmp_path):
    """Start real agents (`source`, then extra arguments) on the engine; stopped after."""
    agents = Agents(engine.host, workroot, tmp_path)
    yield lambda source="netlink", *extra: agents.start(*extra, source=source)
    agents.stop()
