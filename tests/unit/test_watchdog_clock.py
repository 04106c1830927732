"""When the watchdog kind reads a pet, across steps of the wall clock: a pet is a file's
change time (the kernel's wall clock at the pet), which the kind translates to its own
monotonic clock. A step of the wall clock between two looks must never make a pet read
as older than it is: the owner would be ended while it pets (issue 31). The stamps are
given, and the clocks: this is the kind's arithmetic alone (the system tests have the
real files, users and signals)."""

from __future__ import annotations

import pytest

from exitwatch.kinds.spool.entry import Entry
from exitwatch.kinds.watchdogs import kind
from exitwatch.kinds.watchdogs.armed import Armed, pet_time
from exitwatch.kinds.watchdogs.kind import Watchdogs
from exitwatch.owner import Owner

TIMEOUT = 60.0
WALL = 1_800_000_000.0  # the wall clock when the monotonic one reads 0
OWNER = Owner("0" * 8 + "-0000-0000-0000-" + "0" * 12, 4242, 1)


class Clocks:
    """The wall clock the kind reads, which a test steps."""

    def __init__(self) -> None:
        self.step = 0.0

    def wall(self, mono: float) -> float:
        return WALL + mono + self.step


@pytest.fixture
def looks(monkeypatch):
    """look(mono, ctime_mono=None): the kind looks at its one watchdog at monotonic time
    `mono`, the file last petted (its change time set) at monotonic `ctime_mono` by the
    wall clock of then; whether it fired."""
    clocks = Clocks()
    dogs = Watchdogs("/nonexistent")
    entry = Entry("watchdog", "0" * 32, OWNER, "x", None, 1000, 1, 1, 1, (TIMEOUT, 10.0, ""))
    now = {"mono": 0.0}
    monkeypatch.setattr(kind.time, "time", lambda: clocks.wall(now["mono"]))
    armed = Armed(entry, (0, 0), 0.0, clocks.wall(0.0), 0.0, TIMEOUT)
    dogs._armed[entry.key] = armed
    stamp = {"ctime": 0}
    monkeypatch.setattr(dogs, "_stamp", lambda e: (stamp["ctime"], stamp["ctime"]))
    fired: list[float] = []
    monkeypatch.setattr(dogs, "_fire", lambda a, at: fired.append(at))

    def look(mono: float, pet_at: float | None = None, pet_wall: float | None = None) -> bool:
        if pet_at is not None:
            wall = clocks.wall(pet_at) if pet_wall is None else pet_wall
            stamp["ctime"] = int(wall * 1e9)
        now["mono"] = mono
        before = len(fired)
        dogs._look(armed, mono)
        return len(fired) > before

    look.clocks = clocks  # type: ignore[attr-defined]
    return look


def test_a_pet_holds_for_its_timeout(looks):
    assert not looks(60.0, pet_at=50.0)  # petted 10 s before the first look
    assert not looks(109.0)  # due 110
    assert looks(110.5)  # unpetted for 60.5 s


def test_a_pet_just_before_a_forward_step_still_holds_for_its_timeout(looks):
    """Petted at 109, the wall clock stepped an hour ahead at 109.5 (NTP at boot, a VM
    resumed), looked at 110: the pet holds until 169, not ended at 120."""
    assert not looks(60.0, pet_at=50.0)
    pet_wall = looks.clocks.wall(109.0)
    looks.clocks.step = 3600.0
    assert not looks(110.0, pet_at=109.0, pet_wall=pet_wall)
    assert not looks(120.0)
    assert not looks(168.0)
    assert looks(169.5)


def test_a_pet_just_after_a_backward_step_still_holds_for_its_timeout(looks):
    """The wall clock stepped an hour back at 60.5, petted at 100: holds until 160."""
    assert not looks(60.0, pet_at=50.0)
    looks.clocks.step = -3600.0
    assert not looks(110.0, pet_at=100.0)
    assert not looks(159.0)
    assert looks(160.5)


@pytest.mark.parametrize("step", [3600.0, -3600.0])
def test_a_step_never_holds_an_owner_longer_than_the_look_after_its_pet(looks, step):
    """Whatever the step, a pet reads as made no later than the look that saw it."""
    assert not looks(60.0, pet_at=50.0)
    looks.clocks.step = step
    assert not looks(110.0, pet_at=105.0)
    assert looks(170.5)


@pytest.mark.parametrize(
    ("step_at", "step", "pet"),
    [
        (None, 0.0, 30.0),  # no step: the pet as it was made
        (35.0, 3600.0, 30.0),  # forward after the pet: this look's reading is early
        (25.0, 3600.0, 40.0),  # forward before it: read late, held to this look
        (35.0, -3600.0, 40.0),  # back after it: read late, held to this look
        (25.0, -3600.0, 30.0),  # back before it: the last look's reading is early
    ],
)
def test_pet_time_is_never_earlier_than_the_pet(step_at, step, pet):
    """Looks at monotonic 0 and 40 (wall clock WALL + monotonic, stepped by `step` at
    `step_at`), a pet at 30: read at the pet, or later, never before it."""

    def wall(mono: float) -> float:
        return WALL + mono + (step if step_at is not None and mono >= step_at else 0.0)

    assert pet_time(0.0, wall(0.0), 40.0, wall(40.0), wall(30.0)) == pytest.approx(pet)
