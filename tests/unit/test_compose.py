"""Which members of a dead owner's compose project are the owner's (kinds/docker/compose.py),
judged from labels and creation times alone. engine/test_docker.py proves the same rules
on real projects of the private engine."""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime, timedelta

import pytest

from exitwatch.kinds.docker import compose
from exitwatch.kinds.docker.compose import (
    LABEL_CONFIG_FILES,
    LABEL_WORKING_DIR,
    boot_time,
    instance,
    started_at,
    unix_time,
    why_not_ours,
    why_older,
    why_started_before,
)
from exitwatch.owner import Owner, owner_of

from support.procs import kill, spawn_owner

APP = "/srv/app"
EVAL_YML = f"{APP}/docker-compose.yml"
TICK = 1 / os.sysconf("SC_CLK_TCK")


def labels(where: str | None = APP, files: str | None = EVAL_YML) -> dict[str, str]:
    """The compose labels of a container brought up in `where` from `files`."""
    out = {"com.docker.compose.project": "app"}
    if where is not None:
        out[LABEL_WORKING_DIR] = where
    if files is not None:
        out[LABEL_CONFIG_FILES] = files
    return out


def engine_time(at: float, nanoseconds: int = 0) -> str:
    """How the engine writes the unix time `at` (its whole seconds), with `nanoseconds`."""
    whole = datetime.fromtimestamp(int(at), UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{whole}.{nanoseconds:09d}Z"


# -- instance and why_not_ours ------------------------------------------------------------


def test_an_instance_is_its_working_directory_and_config_files():
    assert instance(labels()) == (APP, EVAL_YML)
    assert instance(labels(files=None)) == (APP, "")
    assert instance(labels(where=None)) is None
    assert instance({}) is None


def test_an_unlabelled_sibling_of_the_same_instance_is_ours():
    assert why_not_ours(labels(), [instance(labels())]) is None
    # Among the owner's containers, one of another instance or none changes nothing.
    assert why_not_ours(labels(), [None, ("/elsewhere", ""), (APP, EVAL_YML)]) is None


def test_the_same_working_directory_with_other_config_files_is_not_ours():
    """`docker compose -f prod.yml up` in the eval's own directory: another instance."""
    prod = labels(files=f"{APP}/docker-compose.prod.yml")
    why = why_not_ours(prod, [instance(labels())])
    assert why == f"its compose working directory and config files ({APP}) are not its owner's"


def test_the_same_config_files_in_another_working_directory_are_not_ours():
    elsewhere = labels(where="/srv/prod", files=EVAL_YML)
    assert why_not_ours(elsewhere, [instance(labels())]) is not None


def test_a_sibling_without_a_working_directory_label_is_not_ours():
    why = why_not_ours(labels(where=None), [instance(labels()), None])
    assert why == "it has no compose working directory label"


def test_no_owned_instance_makes_nothing_ours():
    assert why_not_ours(labels(), []) is not None
    assert why_not_ours(labels(), [None]) is not None


# -- unix_time --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-12-01T04:31:00Z", datetime(2026, 12, 1, 4, 31, tzinfo=UTC).timestamp()),
        ("2026-12-01T04:31:00.5Z", datetime(2026, 12, 1, 4, 31, tzinfo=UTC).timestamp() + 0.5),
        (
            "2026-12-01T04:31:00.123456789Z",
            datetime(2026, 12, 1, 4, 31, tzinfo=UTC).timestamp() + 0.123456789,
        ),
        ("2026-12-01T06:31:00+02:00", datetime(2026, 12, 1, 4, 31, tzinfo=UTC).timestamp()),
        ("2026-12-01T01:01:00-03:30", datetime(2026, 12, 1, 4, 31, tzinfo=UTC).timestamp()),
    ],
)
def test_unix_time_reads_the_engines_timestamps_with_their_fractions_and_zones(text, expected):
    # A double holds today's unix time to a fraction of a microsecond, not to the nanosecond.
    assert unix_time(text) == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize(
    "text",
    [
        None,
        1733027460,
        "",
        "yesterday",
        "2026-12-01",
        "2026-12-01T04:31:00",  # no zone: whose local time?
        "2026-12-01 04:31:00Z",
        "2026-12-01T04:31:00.Z",
        " 2026-12-01T04:31:00Z",
        "2026-12-01T04:31:00Z ",
    ],
)
def test_unix_time_is_none_for_anything_else(text):
    assert unix_time(text) is None


# -- why_older and started_at -----------------------------------------------------------------


def test_what_was_created_before_its_owner_started_is_older():
    since = datetime(2026, 12, 1, 4, 31, tzinfo=UTC).timestamp()
    before = engine_time(since - 1, 999_999_000)  # a microsecond before it
    assert why_older(before, since) == "it was created before its owner started"
    assert why_older(engine_time(since - 3600), since) is not None


def test_what_was_created_when_or_after_its_owner_started_is_not():
    since = datetime(2026, 12, 1, 4, 31, tzinfo=UTC).timestamp()
    assert why_older(engine_time(since), since) is None
    assert why_older(engine_time(since, 1), since) is None
    assert why_older(engine_time(since + 60), since) is None


def test_an_unreadable_creation_time_is_not_proof_of_youth():
    since = time.time()
    assert why_older("", since) == "its creation time '' cannot be read"
    assert why_older(None, since) == "its creation time None cannot be read"


def test_no_start_time_proves_nothing_younger_and_says_why():
    why = "its owner ran in an earlier boot, so which started first is unknown"
    assert why_older(engine_time(time.time()), why) == why


def test_started_at_says_why_not_for_an_owner_of_another_boot():
    me = owner_of()
    other_boot = Owner("00000000-0000-0000-0000-000000000000", me.pid, me.starttime)
    assert started_at(other_boot) == (
        "its owner ran in an earlier boot, so which started first is unknown"
    )


def test_a_wall_clock_stepped_since_the_owner_was_first_seen_proves_no_order(monkeypatch):
    """A real step moves /proc/stat's btime with it: only the boot time read when the owner
    was first seen tells it, either way. Within a second, the later reading is taken."""
    now = boot_time()
    me = owner_of()
    for step in (-3600.0, -1.5, 1.5, 3600.0):
        monkeypatch.setattr(compose, "boot_time", lambda step=step: now + step)
        monkeypatch.setattr(compose.procfs, "btime", lambda step=step: int(now + step))
        why = started_at(me, seen=now)
        assert isinstance(why, str) and f"stepped by {step:+.0f} s since its owner" in why, why
    monkeypatch.setattr(compose, "boot_time", lambda: now - 0.5)
    monkeypatch.setattr(compose.procfs, "btime", lambda: int(now - 0.5))
    assert started_at(me, seen=now) == pytest.approx(now + me.starttime * TICK)


def test_a_wall_clock_shifted_for_this_process_alone_proves_no_order(monkeypatch):
    """The kernel's btime is not shifted with it (tests/engine/test_clock_steps.py shifts
    a real process's clock)."""
    now = boot_time()
    for shift in (-3600.0, -2.5, 2.5, 3600.0):
        monkeypatch.setattr(compose, "boot_time", lambda shift=shift: now + shift)
        why = started_at(owner_of())
        assert isinstance(why, str) and "off the kernel's boot time" in why, why
    monkeypatch.setattr(compose, "boot_time", lambda: now + 0.9)
    assert isinstance(started_at(owner_of()), float)


def test_a_container_whose_process_started_before_its_owner_is_older_whatever_the_clock():
    child = spawn_owner()
    try:
        mine = {"Running": True, "Pid": os.getpid()}  # this process began before the child
        assert why_started_before(mine, child.owner) == (
            "its main process started before its owner did"
        )
        theirs = {"Running": True, "Pid": child.pid}
        assert why_started_before(theirs, owner_of()) is None
        # Not running, or no such process: no proof either way.
        assert why_started_before({"Running": False, "Pid": 0}, child.owner) is None
        assert why_started_before({"Running": True, "Pid": 0}, child.owner) is None
        assert why_started_before(None, child.owner) is None
    finally:
        kill(child)
    assert why_started_before({"Running": True, "Pid": child.pid}, owner_of()) is None


def test_started_at_is_at_most_a_tick_before_the_real_start():
    """Never later than the start, so nothing the owner created is judged older; at most
    one clock tick earlier, so what existed a tick before it is."""
    before = time.time()
    child = spawn_owner()
    try:
        after = time.time()
        at = started_at(child.owner)
        assert isinstance(at, float)
        assert before - TICK - 0.005 <= at <= after
        created = engine_time(after, int((after % 1) * 1e9))
        assert why_older(created, at) is None
        long_before = datetime.fromtimestamp(before, UTC) - timedelta(seconds=1)
        assert why_older(engine_time(long_before.timestamp()), at) is not None
    finally:
        kill(child)
