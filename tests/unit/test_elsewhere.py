"""Other machines' owners in the agent's loop, with the fake kind of support/things.py and
an exit source that says whom it watches: never watched, judged or removed, alive or not;
told once each; counted apart in the gauges. An earlier boot of this machine is dead.

The owners are real processes' identities: another machine's is this process's pid and
start time under another boot id and machine id (what a runner on another host names on a
shared engine); an earlier boot's is the same with this machine's id."""

from __future__ import annotations

import logging

from exitwatch.agent.loop import Agent
from exitwatch.kinds.base import Found, Gone
from exitwatch.owner import Owner, current_machine_id, owner_of
from exitwatch.service.config import Config
from exitwatch.sources.base import Exit, Source

from support.procs import wait_for
from support.things import Things, thing

OTHER_BOOT = "00000000-0000-0000-0000-000000000000"
OTHER_MACHINE = "1" * 32 if current_machine_id() == "0" * 32 else "0" * 32


class Watching(Source):
    """An exit source that records whom it is asked to watch, and reports no exit."""

    name = "watching"

    def __init__(self) -> None:
        self.watched: list[Owner] = []

    def start(self, emit) -> None:
        pass

    def watch(self, owner: Owner) -> None:
        self.watched.append(owner)

    def unwatch(self, owner: Owner) -> None:
        pass

    def stop(self) -> None:
        pass


def _away(pid: int | None = None, start: int | None = None) -> Owner:
    me = owner_of()
    return Owner(OTHER_BOOT, pid or me.pid, start or me.starttime, OTHER_MACHINE)


def test_another_machines_owner_is_neither_watched_nor_removed_and_told_once(running, caplog):
    caplog.set_level(logging.INFO, logger="exitwatch.agent.elsewhere")
    source, kind = Watching(), Things()
    agent = running(kind, source)
    away = _away()
    for key in ("a", "b"):  # two of its containers: one line for the owner, not per event
        agent.submit(Found(thing(key, away)))
    agent.submit(Exit(away.pid))  # its pid here is this process's: a hint names nobody of it
    here = owner_of()
    agent.submit(Found(thing("mine", here)))  # a live owner of this machine, for contrast
    wait_for(lambda: agent.ask(lambda: len(agent.index)) == 2, what="both owners indexed")
    assert source.watched == [here]
    assert kind.calls == []
    told = [r for r in caplog.records if r.name == "exitwatch.agent.elsewhere"]
    assert [r.getMessage() for r in told] == [
        f"owner {away} is of machine {OTHER_MACHINE}, not this one: what it holds is left alone"
    ]
    assert told[0].fields == {"event": "elsewhere", "owner": str(away), "machine": OTHER_MACHINE}
    gauges = agent.ask(agent.gauges)
    assert (gauges["owners"], gauges["elsewhere"]) == (1, 1)
    assert gauges["resources"] == {"thing": 1}  # this machine's owner's one
    # Gone, then held again: still told of once.
    agent.submit(Gone("thing", "a"))
    agent.submit(Gone("thing", "b"))
    agent.submit(Found(thing("c", away)))
    wait_for(lambda: agent.ask(lambda: agent.index.keys("thing")) == {"c", "mine"}, what="c")
    assert len([r for r in caplog.records if r.name == "exitwatch.agent.elsewhere"]) == 1
    assert kind.calls == [] and source.watched == [here]


def test_a_one_shot_reap_leaves_another_machines_dead_owner_and_removes_an_earlier_boots():
    kind = Things()
    me = owner_of()
    gone = Owner(OTHER_BOOT, me.pid, me.starttime + 1, OTHER_MACHINE)  # not alive here either
    earlier = Owner(OTHER_BOOT, me.pid, me.starttime, current_machine_id())
    kind.listing = (thing("theirs", gone), thing("before", earlier))
    agent = Agent(Config(), [kind])
    assert agent.reconcile() == []
    assert kind.calls == [["before"]]


def test_reap_refuses_another_machines_owner_whatever_asks():
    """The removal's own check: nothing of another machine's owner goes, even if a job
    for it were started."""
    kind = Things()
    away = _away(start=owner_of().starttime + 1)
    outcomes = kind.reap(away, [thing("theirs", away)], dry_run=False)
    assert [(o.ok, o.refused) for o in outcomes] == [(False, True)]
    assert outcomes[0].detail == f"its owner {away} is of machine {OTHER_MACHINE}, not this one"
    assert kind.calls == []
