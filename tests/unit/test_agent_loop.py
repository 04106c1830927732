"""The agent's loop on its own, with the fake kind of support/things.py: retries,
re-admission during a removal, coalesced resyncs, a bad item. The owners are real: this
process (alive) and this process's pid with another start time (a reused pid: dead)."""

from __future__ import annotations

import errno
import threading

import pytest

from exitwatch.agent.loop import Agent
from exitwatch.kinds.base import Found, Gone, Outcome, Snapshot
from exitwatch.kinds.base import Resource as Res
from exitwatch.owner import Owner
from exitwatch.service.config import Config
from exitwatch.sources.base import Lost, Source

from support.procs import wait_for
from support.things import DEAD, Things, thing


def test_a_resource_seen_again_while_it_is_being_removed_gets_no_second_job(running):
    kind = Things()
    kind.removal.clear()
    agent = running(kind)
    agent.submit(Found(thing("a")))
    wait_for(lambda: kind.calls, what="the removal to start")
    agent.submit(Snapshot("thing", (thing("a"), thing("b"))))  # a fresh listing
    wait_for(lambda: len(kind.calls) == 2, what="the new resource's removal")
    kind.removal.set()
    wait_for(lambda: agent.ask(agent.pending) == [], what="both removals to end")
    assert kind.calls == [["a"], ["b"]]


def test_a_failing_removal_is_retried_then_given_up_and_counted(running):
    kind = Things(fail=True)
    agent = running(kind, reap_attempts=2)
    agent.submit(Found(thing("stuck")))
    wait_for(lambda: agent.counters()["gave_up"] == 1, what="the agent to give up")
    assert kind.calls == [["stuck"], ["stuck"]]
    assert agent.counters()["removal_errors"] == 2
    # Given up, it is no longer "under way": a later listing that shows it starts again.
    agent.submit(Found(thing("stuck")))
    wait_for(lambda: len(kind.calls) == 3, what="a new job for it")


def test_lost_hints_are_coalesced_into_few_resyncs(running):
    agent = Agent(Config(), [Things()])
    for _ in range(200):
        agent.submit(Lost("test"))
    thread = threading.Thread(target=agent.run)
    thread.start()
    try:
        wait_for(lambda: agent.counters()["resyncs"] >= 1, what="a resync")
        assert agent.ask(lambda: agent.counters()["resyncs"]) < 200
    finally:
        agent.stop()
        thread.join(10)


def test_a_bad_item_is_logged_and_the_loop_goes_on(running, caplog):
    kind = Things()
    agent = running(kind)
    agent.submit(Found(Res("bogus", "x", DEAD, "x")))  # a kind the agent does not have
    agent.submit(Found(thing("fine")))
    wait_for(lambda: kind.calls == [["fine"]], what="the next item handled")
    assert any("handling Found failed" in r.getMessage() for r in caplog.records)


def test_questions_after_the_loop_stopped_fail_at_once():
    agent = Agent(Config(), [Things()])
    thread = threading.Thread(target=agent.run)
    thread.start()
    agent.stop()
    thread.join(10)
    with pytest.raises(TimeoutError, match="stopped"):
        agent.ask(agent.pending)


class Keyed(Things):
    """Fails the resources named in `failing`; each outcome names its resource."""

    def __init__(self, failing: set[str]) -> None:
        super().__init__()
        self.failing = failing

    def remove(self, owner, resources, dry_run, how) -> list[Outcome]:
        self.calls.append([r.key for r in resources])
        return [
            Outcome(what=f"thing {r.key}", kind=self.kind, ok=r.key not in self.failing, key=r.key)
            for r in resources
        ]


def test_only_what_failed_is_retried_and_a_given_up_one_shows_until_it_is_gone(running):
    kind = Keyed({"bad"})
    agent = running(kind, reap_attempts=2)
    agent.submit(Snapshot("thing", (thing("good"), thing("bad"))))
    wait_for(lambda: agent.counters()["gave_up"] == 1, what="the agent to give up")
    assert kind.calls == [["good", "bad"], ["bad"]]
    [item] = agent.ask(agent.pending)
    what = [r.name or r.key for r in item.job.resources]
    assert (what, item.state, item.job.attempt) == (["bad"], "given up", 2)
    agent.submit(Gone("thing", "bad"))
    wait_for(lambda: agent.ask(agent.pending) == [], what="the given-up item to go")


class Listing(Things):
    def scan(self) -> Snapshot:
        return Snapshot(self.kind, (thing("held"),))


@pytest.mark.parametrize("failures", [1, 100])
def test_a_one_shot_reap_judges_again_an_owner_it_could_not_read(monkeypatch, failures):
    """Not skipped silently: judged again, and named if it still cannot be read."""
    from exitwatch.agent import loop as agent_module
    from exitwatch.agent import rechecks

    real, calls = agent_module.death, []

    def unreadable(owner):
        calls.append(owner)
        if len(calls) <= failures:
            raise OSError(errno.EMFILE, "Too many open files")
        return real(owner)

    monkeypatch.setattr(agent_module, "death", unreadable)
    monkeypatch.setattr(rechecks, "DELAY", 0.05)
    kind = Listing()
    problems = Agent(Config(reap_attempts=3), [kind]).reconcile()
    if failures == 1:
        assert problems == [] and kind.calls == [["held"]]
    else:
        assert len(calls) == 3 and kind.calls == []
        assert problems == [f"could not tell whether 1 owners live, {DEAD} the first"]


class Flaky(Source):
    """An exit source whose first `failures` watches raise EMFILE; it says whom it watches.
    It reports no exits: only the loop's own checks can find a death."""

    name = "flaky"

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.tried: list[Owner] = []
        self.watched: set[Owner] = set()

    def start(self, emit) -> None:
        pass

    def watch(self, owner: Owner) -> None:
        self.tried.append(owner)
        if len(self.tried) <= self.failures:
            raise OSError(errno.EMFILE, "Too many open files")
        self.watched.add(owner)

    def unwatch(self, owner: Owner) -> None:
        self.watched.discard(owner)

    def stop(self) -> None:
        pass


def test_a_failed_watch_is_tried_again_and_the_owner_judged_after_it(monkeypatch):
    """Judged alive but unwatched, an owner's exit would bring no hint: the watch is tried
    again, and the owner judged again once it is in place (it may have died meanwhile)."""
    from exitwatch.agent import loop as agent_module
    from exitwatch.agent import rechecks

    monkeypatch.setattr(rechecks, "DELAY", 0.05)
    real, judged = agent_module.death, []

    def alive_until_watched(owner):
        judged.append(owner)
        return None if len(judged) == 1 else real(owner)  # dies while it is unwatched

    monkeypatch.setattr(agent_module, "death", alive_until_watched)
    source, kind = Flaky(failures=2), Things()
    agent = Agent(Config(), [kind], source)
    thread = threading.Thread(target=agent.run)
    thread.start()
    try:
        agent.submit(Found(thing("held")))
        wait_for(lambda: kind.calls == [["held"]], what="the removal after the third watch")
        assert source.tried == [DEAD] * 3 and len(judged) == 2
    finally:
        agent.stop()
        thread.join(10)


def test_a_dead_owner_whose_watch_fails_is_reaped_at_once():
    source, kind = Flaky(failures=100), Things()
    agent = Agent(Config(), [kind], source)
    thread = threading.Thread(target=agent.run)
    thread.start()
    try:
        agent.submit(Found(thing("held")))
        wait_for(lambda: kind.calls == [["held"]], what="the removal")
        assert source.watched == set()
        # Reaped, it is not watched again.
        tries = len(source.tried)
        wait_for(lambda: agent.ask(lambda: agent._rechecks.due) is None, what="no re-check due")
        assert len(source.tried) == tries
    finally:
        agent.stop()
        thread.join(10)


def test_a_periodic_reconcile_judges_every_owner_again(monkeypatch):
    """Not only what its listing brings: an owner wrongly judged alive once (a judgement
    lost on some path) is found dead by the next reconcile, its listing unchanged."""
    from exitwatch.agent import loop as agent_module

    real, calls = agent_module.death, []

    def wrong_once(owner):
        calls.append(owner)
        return None if len(calls) == 1 else real(owner)

    monkeypatch.setattr(agent_module, "death", wrong_once)
    kind = Listing()
    kind.listing = (thing("held"),)
    agent = Agent(Config(reconcile_interval=1), [kind])
    thread = threading.Thread(target=agent.run)
    thread.start()
    try:
        wait_for(lambda: kind.calls == [["held"]], timeout=10, what="the reconcile's removal")
        assert agent.counters()["reconcile_missed"] == 0
    finally:
        agent.stop()
        thread.join(10)
