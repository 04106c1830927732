"""Nested workdir roots in a real agent: a marked root inside another root is refused, and
said so, while the plain workdir beside it goes. system/test_nested_roots.py drives the
workdir kind itself."""

from __future__ import annotations

from support.agentproc import Agent, agent_argv, wait_gone
from support.trees import nest


def test_the_agent_never_removes_a_marked_inner_root(engine, workroot, tmp_path):
    inner, other, _ = nest(workroot)
    argv = agent_argv("netlink", engine.host, workroot, inner)
    agent = Agent(argv, tmp_path / "agent.log")
    try:
        agent.wait_log("ready:")
        wait_gone(engine, paths=[other])
        agent.wait_log(f"workdir {inner}: refused to remove: it is a workdir root")
        assert (inner / "sub" / "data").exists() and (inner / ".exitwatch-owner").exists()
    finally:
        agent.stop()
