"""The periodic reconcile in the agent's loop, with the fake kind of support/things.py,
whose listing the test controls: it retries what was given up, lays the changes made
while it listed over its stale listing, and never holds up the exit path. The owners are
real: this process (alive) and this process's pid with another start time (a reused pid:
dead). The end-to-end proof with a real agent, a real workdir and the kernel's immutable
flag is in engine/test_reconcile_agent.py; Periodic's merging on its own in
test_periodic.py."""

from __future__ import annotations

import os
import threading
import time

import pytest

from exitwatch.agent.loop import Agent
from exitwatch.kinds.base import Found, Gone
from exitwatch.owner import owner_of
from exitwatch.service.config import Config, ConfigError, load

from support.procs import wait_for
from support.things import Things as Listed
from support.things import thing

ALIVE = owner_of(os.getpid())


@pytest.fixture
def running():
    started: list[tuple[Agent, threading.Thread, Listed]] = []

    def start(kind: Listed, **config) -> Agent:
        agent = Agent(Config(**config), [kind])
        thread = threading.Thread(target=agent.run)
        thread.start()
        started.append((agent, thread, kind))
        return agent

    yield start
    for agent, thread, kind in started:
        kind.release.set()
        agent.stop()
        thread.join(10)
        agent.drain(10)


def keys(agent: Agent) -> object:
    """The keys the agent's index holds, read on its loop thread."""
    index = agent.index
    return agent.ask(lambda: {r.key for o in index.owners() for r in index.resources(o)})


def test_a_given_up_resource_is_removed_by_the_next_reconcile(running):
    kind = Listed()
    kind.fail = True
    kind.listing = (thing("stuck"),)
    agent = running(kind, reap_attempts=1, reconcile_interval=1)
    wait_for(lambda: agent.counters()["gave_up"] == 1, what="the agent to give up")
    kind.fail = False  # say, chattr -i
    wait_for(lambda: len(kind.calls) >= 2, what="the next reconcile to try again")
    wait_for(lambda: agent.counters().get("reaped_thing") == 1, what="the removal counted")
    counters = agent.counters()
    assert counters["reconciles"] >= 2  # the start-up one, and a periodic one
    assert counters["reconcile_missed"] >= 1
    last = agent.ask(lambda: agent.periodic.last)
    assert last.run >= 1 and last.listed == 1


def test_what_was_given_up_and_is_gone_is_no_longer_shown_as_given_up(running):
    kind = Listed()
    kind.fail = True
    kind.listing = (thing("stuck"),)
    agent = running(kind, reap_attempts=1, reconcile_interval=1)
    wait_for(lambda: agent.counters()["gave_up"] == 1, what="the agent to give up")
    assert [p.state for p in agent.ask(agent.pending)] == ["given up"]
    kind.listing = ()  # removed by hand meanwhile
    wait_for(lambda: agent.ask(agent.pending) == [], what="the given-up entry pruned")


class Silent(Listed):
    """A kind whose watcher never sends its start-up listing (its engine is down)."""

    def start(self, notify) -> None:
        pass


def test_a_kind_without_its_start_up_listing_holds_up_no_reconcile(running):
    kind = Silent()
    kind.listing = (thing("orphan"),)
    agent = running(kind, reconcile_interval=1)
    wait_for(lambda: kind.calls == [["orphan"]], what="a periodic reconcile to reap it")
    last = agent.ask(lambda: agent.periodic.last)
    assert last.errors == ("thing: no start-up listing yet",)
    assert agent.counters()["reconcile_errors"] >= 1


def test_changes_made_while_it_lists_are_laid_over_its_listing(running):
    kind = Listed()
    kind.listing = (thing("old", ALIVE), thing("deleted", ALIVE))
    agent = running(kind, reconcile_interval=1)
    wait_for(lambda: keys(agent) == {"old", "deleted"}, what="the start-up listing")
    kind.scanning.clear()
    kind.release.clear()
    wait_for(kind.scanning.is_set, what="a periodic reconcile to begin listing")
    # While it lists: a new resource appears and one goes. The listing has neither change.
    agent.submit(Found(thing("new", ALIVE)))
    agent.submit(Gone("thing", "deleted"))
    wait_for(lambda: keys(agent) == {"old", "new"}, what="the changes handled")
    done = agent.counters()["reconciles"]
    kind.release.set()
    wait_for(lambda: agent.counters()["reconciles"] > done, what="the listing applied")
    assert keys(agent) == {"old", "new"}


def test_a_finished_removal_does_not_erase_a_newer_find(running):
    kind = Listed()
    agent = running(kind, reconcile_interval=1)
    kind.removal.clear()
    agent.submit(Found(thing("x")))
    wait_for(lambda: kind.calls == [["x"]], what="its removal to begin")
    kind.scanning.clear()
    kind.release.clear()
    kind.listing = (thing("x", ALIVE),)
    wait_for(kind.scanning.is_set, what="a periodic reconcile to begin listing")
    # While it lists: a new owner's x is found, then the old x's removal ends.
    agent.submit(Found(thing("x", ALIVE)))
    done = agent.counters()["reconciles"]
    kind.removal.set()
    wait_for(lambda: agent.counters().get("reaped_thing") == 1, what="the removal to end")
    kind.release.set()
    wait_for(lambda: agent.counters()["reconciles"] > done, what="the listing applied")
    assert keys(agent) == {"x"}


def test_the_exit_path_goes_on_while_it_lists(running):
    kind = Listed()
    agent = running(kind, reconcile_interval=1)
    kind.scanning.clear()
    kind.release.clear()
    wait_for(kind.scanning.is_set, what="a periodic reconcile to begin listing")
    agent.submit(Found(thing("orphan")))
    wait_for(lambda: kind.calls == [["orphan"]], what="the removal, while the scan is held")
    assert agent.ask(lambda: agent.periodic.running)
    kind.release.set()


def test_off_means_only_the_start_up_listing(running):
    kind = Listed()
    agent = running(kind, reconcile_interval=0)
    wait_for(lambda: agent.counters()["reconciles"] == 1, what="the start-up listing")
    assert agent.ask(lambda: agent.periodic.next_in(time.monotonic())) is None
    assert kind.scans == 0


@pytest.mark.parametrize("value", [-1, 0.5, 86401])
def test_bad_intervals_are_refused(tmp_path, value):
    path = tmp_path / "config.toml"
    path.write_text(f"reconcile_interval = {value}\n")
    with pytest.raises(ConfigError, match="reconcile_interval: expected 0 \\(off\\)"):
        load(str(path))
