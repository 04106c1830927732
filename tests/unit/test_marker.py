"""The owner marker's rules (kinds/workdirs/marker.py): what a marker's text must be to name
an owner, and when a marker may claim its directory. system/test_workdirs.py meets the
same rules through scans and removals of real trees."""

from __future__ import annotations

import json
import os
import stat

import pytest

from exitwatch.contract import JSON_MAX_DEPTH, MARKER_MAX_BYTES
from exitwatch.kinds.workdirs.marker import MarkerError, _parse, claim
from exitwatch.owner import Owner, owner_of

ME = owner_of()


def body(**fields: object) -> bytes:
    return json.dumps(fields).encode()


def stat_of(uid: int, nlink: int = 1, mode: int = stat.S_IFREG | 0o644) -> os.stat_result:
    """A stat as fstat gives it, of the fields claim() reads (the others zero)."""
    return os.stat_result((mode, 0, 0, nlink, uid, uid, 0, 0, 0, 0))


# -- parsing -----------------------------------------------------------------------------------


def test_a_marker_names_its_owner():
    assert _parse(body(owner=str(ME))) == ME
    # Other keys are the runner's business; the owner alone is read.
    assert _parse(body(owner=str(ME), run="eval-7", pad="x" * 100)) == ME


def test_a_marker_of_the_size_limit_is_read_and_one_byte_more_is_refused():
    pad = MARKER_MAX_BYTES - len(body(owner=str(ME), pad=""))
    assert _parse(body(owner=str(ME), pad="x" * pad)) == ME
    with pytest.raises(MarkerError, match=f"^is larger than {MARKER_MAX_BYTES} bytes$"):
        _parse(body(owner=str(ME), pad="x" * (pad + 1)))


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b'{"owner": "caf\xe9"}', "is not UTF-8"),
        (b"owner: me", "is not JSON"),
        (b"", "is not JSON"),
        (b'{"owner": ', "is not JSON"),
        (b"[" * 4000, "is JSON nested too deeply"),
        # Whole JSON that Python 3.13 parses and 3.11 cannot, and JSON any Python parses:
        # refused alike, before json.loads, wherever the interpreter would give up.
        (b"[" * 2000 + b"]" * 2000, "is JSON nested too deeply"),
        (b"[" * (JSON_MAX_DEPTH + 1) + b"]" * (JSON_MAX_DEPTH + 1), "is JSON nested too deeply"),
        (b"[" * JSON_MAX_DEPTH + b"]" * JSON_MAX_DEPTH, 'has no "owner" string'),
        (b'"' + b'\\"[' * 1000, "is not JSON"),  # an unterminated string of escaped quotes
        (b"[]", 'has no "owner" string'),
        (b'"a string"', 'has no "owner" string'),
        (b"{}", 'has no "owner" string'),
        (b'{"who": "me"}', 'has no "owner" string'),
        (b'{"owner": 12}', 'has no "owner" string'),
        (b'{"owner": null}', 'has no "owner" string'),
    ],
)
def test_a_malformed_marker_says_what_is_wrong_with_it(data, why):
    with pytest.raises(MarkerError) as err:
        _parse(data)
    assert str(err.value) == why


@pytest.mark.parametrize("text", ["", "1:2:3", f"{ME.boot_id}:0:5", f"{ME.boot_id}:12", "me"])
def test_a_marker_naming_a_bad_owner_says_why(text):
    with pytest.raises(MarkerError, match=r"^names a bad owner: "):
        _parse(body(owner=text))


def test_brackets_within_strings_are_no_nesting():
    assert _parse(body(owner=str(ME), run="[" * 3000 + '\\"{' * 100)) == ME


def test_a_marker_of_another_boot_still_names_its_owner():
    """Whether that owner lives is death()'s question, not the parser's."""
    other = Owner("00000000-0000-0000-0000-000000000000", 1, 1)
    assert _parse(body(owner=str(other))) == other


# -- claiming ----------------------------------------------------------------------------------


def test_the_directorys_owner_or_root_may_claim_it():
    assert claim(stat_of(1000, mode=stat.S_IFDIR | 0o755), stat_of(1000)) is None
    assert claim(stat_of(1000, mode=stat.S_IFDIR | 0o755), stat_of(0)) is None
    assert claim(stat_of(0, mode=stat.S_IFDIR | 0o1777), stat_of(0)) is None


def test_anyone_else_may_not_even_in_a_world_writable_directory():
    why = claim(stat_of(4242, mode=stat.S_IFDIR | 0o777), stat_of(1000))
    assert why == "belongs to uid 1000, the directory to uid 4242"
    assert claim(stat_of(0, mode=stat.S_IFDIR | 0o1777), stat_of(1000)) == (
        "belongs to uid 1000, the directory to uid 0"
    )


@pytest.mark.parametrize("nlink", [0, 2, 3])
def test_a_marker_with_other_than_one_link_claims_nothing(nlink):
    """A hard link would let a marker root wrote for one directory claim another."""
    assert claim(stat_of(0), stat_of(0, nlink=nlink)) == f"has {nlink} hard links"
    assert claim(stat_of(1000), stat_of(1000, nlink=nlink)) == f"has {nlink} hard links"
