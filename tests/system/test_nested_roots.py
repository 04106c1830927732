"""Nested workdir roots: a root inside another root is found as a workdir of the outer one
when it carries a marker, and is still never removed. Real directories, a real dead owner."""

from __future__ import annotations

from pathlib import Path

from exitwatch import mark_workdir
from exitwatch.kinds.workdirs.kind import Workdirs

from support.agentproc import Agent, agent_argv, wait_gone
from support.procs import kill, spawn_owner


def nest(top: Path) -> tuple[Path, Path, Path]:
    """top/inner (a root, marked) and top/other (a plain workdir) of an owner now dead."""
    owner = spawn_owner()
    inner, other = top / "inner", top / "other"
    for path in (inner, other):
        (path / "sub").mkdir(parents=True)
        (path / "sub" / "data").write_bytes(b"x" * 100)
        mark_workdir(path, owner.pid)
    kill(owner)
    return inner, other, owner.owner


def test_a_marked_inner_root_is_found_but_never_removed(workroot):
    inner, other, owner = nest(workroot)
    kind = Workdirs([str(workroot), str(inner)])
    found = {r.key: r for r in kind.scan().resources}
    assert set(found) == {str(inner), str(other)}
    outs = kind.remove(owner, [found[str(inner)], found[str(other)]], dry_run=False)
    by_what = {o.what: o for o in outs}
    refused = by_what[f"workdir {inner}"]
    assert refused.refused and not refused.ok
    assert "a root is never removed" in refused.detail
    assert by_what[f"workdir {other}"].ok
    assert (inner / "sub" / "data").exists() and (inner / ".exitwatch-owner").exists()
    assert not other.exists()


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
