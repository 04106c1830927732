"""What the watchdog kind's timer knows of each watchdog it follows (when it was last looked
at and petted, whether it fired), what status shows of them, and how a pet's change time
is read on the agent's monotonic clock."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypedDict

from exitwatch.kinds.spool.entry import Entry


class Firing(TypedDict):
    """One owner a watchdog ended, as status shows it."""

    time: float  # unix time of the SIGTERM
    owner: str
    watchdog: str
    after_s: float  # seconds without a pet
    killed: bool  # SIGKILL was needed after the grace


class WatchdogsHealth(TypedDict):
    """The status document's `watchdogs` entry."""

    armed: int  # watchdogs of live owners followed now
    fired: int  # owners ended since start
    killed: int  # of which needed SIGKILL after their grace
    refused: int  # firings refused (the owner runs as another user than the watchdog's)
    unreadable: int  # looks that could not be made: the owner's state, or the pet file
    last_unreadable: str | None
    recent: list[Firing]


@dataclass
class Armed:
    entry: Entry
    stamp: tuple[int, int]  # the file's (ctime, mtime) in ns when last looked at
    looked: float  # monotonic time of that look
    looked_wall: float  # the wall clock at that look
    pet: float  # monotonic time of the last pet, as near as the look can tell
    due: float
    fired: Fired | None = None


@dataclass
class Fired:
    pidfd: int
    at: float
    kill_at: float
    firing: Firing
    done: bool = field(default=False)


def pet_time(looked: float, looked_wall: float, now: float, wall: float, ctime: float) -> float:
    """When a pet seen at this look (monotonic `now`, wall clock `wall`) and not at the
    last one (`looked`, `looked_wall`) was made, on the monotonic clock, from the file's
    change time `ctime` (the kernel's wall clock at the pet).

    Read twice, as so long before this look and as so long after the last one, each by
    the wall clock of that look; the later kept, and held between the two looks. A step of
    the wall clock between the looks makes one reading early and leaves the other right,
    or late: the later is never earlier than the pet (one made just before a step forward
    would otherwise read as made at the last look, and its owner be ended early), and no
    step moves a pet out of the window."""
    after_last = looked + (ctime - looked_wall)
    return min(now, max(looked, now - (wall - ctime), after_last))
