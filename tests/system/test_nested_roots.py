"""Nested workdir roots: a root inside another root is found as a workdir of the outer one
when it carries a marker, and is still never removed. Real directories, a real dead owner;
engine/test_nested_roots_agent.py has the same in a real agent."""

from __future__ import annotations

from exitwatch.kinds.workdirs.kind import Workdirs

from support.trees import nest


def test_a_marked_inner_root_is_found_but_never_removed(workroot):
    inner, other, owner = nest(workroot)
    kind = Workdirs([str(workroot), str(inner)])
    found = {r.key: r for r in kind.scan().resources}
    assert set(found) == {str(inner), str(other)}
    outs = kind.reap(owner, [found[str(inner)], found[str(other)]], dry_run=False)
    by_what = {o.what: o for o in outs}
    refused = by_what[f"workdir {inner}"]
    assert refused.refused and not refused.ok
    assert "a root is never removed" in refused.detail
    assert by_what[f"workdir {other}"].ok
    assert (inner / "sub" / "data").exists() and (inner / ".exitwatch-owner").exists()
    assert not other.exists()
