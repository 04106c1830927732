"""The discovery toolkit on its own (exitwatch/kinds/discovery.py): a listing told as a
Snapshot, then as the changes between listings."""

from __future__ import annotations

from exitwatch.kinds.base import Found, Gone, Resource, Snapshot
from exitwatch.kinds.discovery import Listing
from exitwatch.owner import Owner

A = Owner("boot", 100, 1)
B = Owner("boot", 200, 2)


def _res(key: str, owner: Owner = A) -> Resource:
    return Resource("thing", key, owner)


def _listing() -> tuple[Listing, list]:
    told: list = []
    return Listing("thing", told.append), told


def test_the_first_listing_is_a_snapshot_in_key_order():
    listing, told = _listing()
    listing.report({"b": _res("b"), "a": _res("a")})
    assert told == [Snapshot("thing", (_res("a"), _res("b")))]
    listing.report({"a": _res("a"), "b": _res("b")})
    assert len(told) == 1  # nothing changed: nothing told


def test_an_empty_first_listing_is_told_too():
    listing, told = _listing()
    listing.report({})
    assert told == [Snapshot("thing", ())] and listing.known == {}


def test_later_listings_tell_gone_first_then_new_and_changed():
    listing, told = _listing()
    listing.report({"a": _res("a"), "b": _res("b"), "c": _res("c")})
    told.clear()
    listing.report({"a": _res("a"), "b": _res("b", B), "d": _res("d")})
    assert told == [Gone("thing", "c"), Found(_res("b", B)), Found(_res("d"))]
    assert listing.known == {"a": _res("a"), "b": _res("b", B), "d": _res("d")}


def test_a_listing_of_some_keys_changes_only_those():
    listing, told = _listing()
    listing.report({"x/1": _res("x/1"), "x/2": _res("x/2"), "y/1": _res("y/1")})
    told.clear()
    # x looked at again: x/1 went, x/3 came; y/1 is not in the listing, and stays.
    listing.report({"x/2": _res("x/2"), "x/3": _res("x/3")}, ["x/1", "x/2", "x/3"])
    assert told == [Gone("thing", "x/1"), Found(_res("x/3"))]
    assert set(listing.known or {}) == {"x/2", "x/3", "y/1"}


def test_a_key_gone_that_was_never_told_is_not_told_gone():
    listing, told = _listing()
    listing.report({})
    listing.report({}, ["never"])
    assert told == [Snapshot("thing", ())]
