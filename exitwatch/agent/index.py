"""The index: which live owners hold which resources."""

from __future__ import annotations

from collections import Counter, defaultdict

from exitwatch.kinds.base import Resource
from exitwatch.owner import Owner

Key = tuple[str, str]  # (kind, key)


class Index:
    """owner → resources, with lookups by pid and by resource key.

    Only the agent's loop thread touches it, so it needs no lock.
    """

    def __init__(self) -> None:
        self._held: dict[Owner, dict[Key, Resource]] = {}
        self._owner_of: dict[Key, Owner] = {}
        self._by_pid: defaultdict[int, set[Owner]] = defaultdict(set)
        self.counts: Counter[str] = Counter()  # resources held, by kind

    def __len__(self) -> int:
        return len(self._held)

    def owners(self) -> list[Owner]:
        return list(self._held)

    def owners_of_pid(self, pid: int) -> set[Owner]:
        return self._by_pid.get(pid, set())

    def owner(self, kind: str, key: str) -> Owner | None:
        """The owner the index has for one resource, if it holds it."""
        return self._owner_of.get((kind, key))

    def keys(self, kind: str) -> set[str]:
        return {key for k, key in self._owner_of if k == kind}

    def resources(self, owner: Owner) -> list[Resource]:
        return list(self._held.get(owner, {}).values())

    def add(self, res: Resource) -> tuple[bool, Owner | None]:
        """Index `res`.

        Returns whether its owner is new to the index, and the previous owner of the same
        resource if that one now holds nothing (a rewritten marker).
        """
        # A start-up Snapshot adds 100,000 workdirs of a few owners: no Owner is hashed or
        # compared (a tuple built per call) more often than it must be.
        key = (res.kind, res.key)
        owner = res.owner
        displaced = None
        before = self._owner_of.get(key)
        if before is None:
            self.counts[res.kind] += 1
        elif before is not owner and before != owner:
            displaced = self.discard(res.kind, res.key)
            self.counts[res.kind] += 1
        held = self._held.get(owner)
        new = held is None
        if held is None:
            held = self._held[owner] = {}
            self._by_pid[owner.pid].add(owner)
        held[key] = res
        self._owner_of[key] = owner
        return new, displaced

    def discard(self, kind: str, key: str) -> Owner | None:
        """Forget one resource. Returns its owner if that owner now holds nothing."""
        owner = self._owner_of.pop((kind, key), None)
        if owner is None:
            return None
        self.counts[kind] -= 1
        held = self._held[owner]
        del held[(kind, key)]
        if held:
            return None
        self._forget(owner)
        return owner

    def pop_owner(self, owner: Owner) -> list[Resource]:
        """Forget an owner and return everything it held."""
        held = self._held.get(owner, {})
        for key in held:
            del self._owner_of[key]
            self.counts[key[0]] -= 1
        self._forget(owner)
        return list(held.values())

    def replace_kind(
        self, kind: str, resources: tuple[Resource, ...], scopes: tuple[str, ...] | None = None
    ) -> tuple[set[Owner], set[Owner]]:
        """Make `resources` the whole truth about `kind`, or about the keys of `kind` that
        begin with one of `scopes` (Snapshot.scopes).

        Returns (owners new to the index, owners that now hold nothing).
        """
        before = set(self._held)
        if self.counts[kind]:  # none to drop at start-up, and the set is 100,000 long
            fresh = {(r.kind, r.key) for r in resources}
            for key in [
                k
                for k in self._owner_of
                if k[0] == kind and k not in fresh and (scopes is None or k[1].startswith(scopes))
            ]:
                self.discard(*key)
        for res in resources:
            self.add(res)
        after = set(self._held)
        return after - before, before - after

    def _forget(self, owner: Owner) -> None:
        self._held.pop(owner, None)
        pids = self._by_pid.get(owner.pid)
        if pids is not None:
            pids.discard(owner)
            if not pids:
                del self._by_pid[owner.pid]
