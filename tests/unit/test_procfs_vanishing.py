"""A process that vanishes between the open of its /proc file and the read (the race made
certain by a procfs open that ends the process): ProcessLookupError from the readers, and
"process gone" from death(), never another error. system/test_procfs_races.py runs the
real race."""

from __future__ import annotations

import builtins

import pytest

from exitwatch import procfs
from exitwatch.owner import death, owner_of

from support.procs import kill, spawn_owner


@pytest.fixture
def vanishing_open(monkeypatch: pytest.MonkeyPatch):
    """Make procfs's next open() end the given process after opening its file: the read
    that follows meets a process that is gone, as it would in a real race."""

    def arm(child) -> None:
        def open_then_vanish(*args, **kwargs):
            f = builtins.open(*args, **kwargs)  # noqa: SIM115 - the caller closes it
            monkeypatch.delattr(procfs, "open")
            kill(child)
            return f

        monkeypatch.setattr(procfs, "open", open_then_vanish, raising=False)

    return arm


def test_stat_of_a_process_that_vanishes_between_open_and_read(vanishing_open):
    child = spawn_owner()
    owner = owner_of(child.pid)
    vanishing_open(child)
    with pytest.raises(ProcessLookupError):
        procfs.read_stat(child.pid)
    assert death(owner) == "process gone"


def test_owner_death_vanishing_mid_read_is_dead_not_an_error(vanishing_open):
    child = spawn_owner()
    owner = owner_of(child.pid)
    vanishing_open(child)
    assert death(owner) == "process gone"
