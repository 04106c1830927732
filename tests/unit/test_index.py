from exitwatch.agent.index import Index
from exitwatch.kinds.base import Resource
from exitwatch.owner import Owner

BOOT = "2a992b04-582f-4283-93d2-115de768301c"
A = Owner(BOOT, 10, 100)
B = Owner(BOOT, 10, 200)  # same pid, another process: a reused pid
C = Owner(BOOT, 11, 300)


def res(kind, key, owner):
    return Resource(kind, key, owner, key)


def test_add_reports_new_owners_and_indexes_by_pid():
    index = Index()
    assert index.add(res("container", "c1", A)) == (True, None)
    assert index.add(res("container", "c2", A)) == (False, None)
    assert index.add(res("workdir", "/tmp/w", B)) == (True, None)
    assert index.owners_of_pid(10) == {A, B}
    assert sorted(r.key for r in index.resources(A)) == ["c1", "c2"]


def test_discard_returns_owner_only_when_it_holds_nothing():
    index = Index()
    index.add(res("container", "c1", A))
    index.add(res("workdir", "/tmp/w", A))
    assert index.discard("container", "c1") is None
    assert index.discard("container", "c1") is None
    assert index.discard("workdir", "/tmp/w") == A
    assert index.owners() == []
    assert index.owners_of_pid(10) == set()


def test_rewritten_marker_moves_the_resource_and_reports_the_displaced_owner():
    index = Index()
    index.add(res("workdir", "/tmp/w", A))
    assert index.add(res("workdir", "/tmp/w", C)) == (True, A)
    assert index.owners() == [C]


def test_pop_owner_forgets_everything_it_held():
    index = Index()
    index.add(res("container", "c1", A))
    index.add(res("container", "c2", C))
    assert [r.key for r in index.pop_owner(A)] == ["c1"]
    assert index.owners() == [C]
    assert index.discard("container", "c1") is None


def test_replace_kind_touches_only_that_kind():
    index = Index()
    index.add(res("container", "c1", A))
    index.add(res("workdir", "/tmp/w", A))
    index.add(res("container", "c2", B))
    added, emptied = index.replace_kind("container", (res("container", "c3", C),))
    assert added == {C}
    assert emptied == {B}
    assert [r.key for r in index.resources(A)] == ["/tmp/w"]


def test_counts_follow_every_change():
    index = Index()
    index.add(res("container", "c1", A))
    index.add(res("container", "c1", A))
    index.add(res("container", "c2", B))
    index.add(res("workdir", "/tmp/w", A))
    assert index.counts == {"container": 2, "workdir": 1}
    index.discard("container", "c2")
    index.pop_owner(A)
    index.replace_kind("workdir", (res("workdir", "/tmp/v", C),))
    assert +index.counts == {"workdir": 1}
