"""Fixtures of the unit tests alone."""

from __future__ import annotations

import threading

import pytest

from exitwatch.agent.loop import Agent
from exitwatch.service.config import Config


@pytest.fixture
def running():
    """Start agents' loops on threads of their own, each on `kind` (a fake of
    support/things.py), with an exit source or none, and settings; stopped after."""
    started: list[tuple[Agent, threading.Thread]] = []

    def start(kind, source=None, **config) -> Agent:
        agent = Agent(Config(**config), [kind], source)
        thread = threading.Thread(target=agent.run)
        thread.start()
        started.append((agent, thread))
        return agent

    yield start
    for agent, thread in started:
        agent.stop()
        thread.join(10)
        agent.drain(10)
