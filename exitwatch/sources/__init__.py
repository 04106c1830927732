"""Pick the exit source once, at start, and say why.

Candidates are tried in order; each is checked for the reasons it cannot run here, then
proven by a self-test on a real throwaway child. Poll always works and comes last.
"""

from __future__ import annotations

import logging
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass

from exitwatch.owner import owner_of
from exitwatch.sources import ebpf, netlink
from exitwatch.sources.base import Exit, Hint, Lost, Source, SourceError
from exitwatch.sources.poll import PollSource

__all__ = ["CANDIDATES", "MODES", "Candidate", "Source", "SourceError", "pick", "self_test"]

log = logging.getLogger(__name__)

SELF_TEST_TIMEOUT = 1.0
# A try whose child's exit the source says it may have lost (a busy host filled its buffer)
# proves nothing either way, and is made again.
SELF_TEST_TRIES = 3
# The test child: it lives until its stdin closes, then exits.
TEST_CHILD = "/bin/cat"


@dataclass(frozen=True)
class Settings:
    poll_interval: float = 1.0
    ebpf_max_owners: int = 65536


@dataclass(frozen=True)
class Candidate:
    name: str
    problem: Callable[[], str | None]  # why it cannot run here, checked before trying
    make: Callable[[Settings], Source]
    feature: Callable[[], str]  # what the self-test proved, for the reason line


def _ebpf(settings: Settings) -> Source:
    # Owners that do not fit in the kernel map are still watched, by polling.
    return ebpf.EbpfSource(settings.ebpf_max_owners, fallback=PollSource(settings.poll_interval))


# Tried in this order by "auto"; a new source is one more line here.
CANDIDATES: tuple[Candidate, ...] = (
    Candidate("ebpf", ebpf.probe, _ebpf, ebpf.feature),
    Candidate("netlink", netlink.problem, lambda _: netlink.NetlinkSource(), netlink.feature),
)
MODES: tuple[str, ...] = ("auto", *(c.name for c in CANDIDATES), PollSource.name)


def self_test(make: Callable[[], Source], timeout: float = SELF_TEST_TIMEOUT) -> None:
    """Prove a source reports a real exit: raises SourceError if it does not within `timeout`.

    A try during which the source said hints were lost, and the child's exit did not come,
    is made again with a fresh child and source, up to SELF_TEST_TRIES times.
    """
    for _ in range(SELF_TEST_TRIES):
        lost = _self_test_once(make, timeout)
        if lost is None:
            return
        log.info("exit source self-test: %s; trying again", lost)
    raise SourceError(
        f"every test child's exit hint of {SELF_TEST_TRIES} self-tests was lost ({lost})"
    )


def _self_test_once(make: Callable[[], Source], timeout: float) -> str | None:
    """None when the source reported the exit of a test child; why it said hints were lost
    when it did not. Raises SourceError when it said neither.

    The child is a program of its own (cat, which exits when its stdin closes), never a
    fork of this process running Python: under MemoryDenyWriteExecute=yes libffi keeps
    ctypes callbacks in memory that a fork shares (MAP_SHARED), and a collection in such a
    child freed the parent's callbacks under it (tests/system/test_mdwe.py). The tested
    instance is stopped afterwards; the caller gets a fresh one, because a source is
    started once, with the emit of the agent.
    """
    try:
        child = subprocess.Popen(
            [TEST_CHILD],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    except OSError as err:
        raise SourceError(f"cannot start a test child ({TEST_CHILD}): {err.strerror}") from None
    assert child.stdin is not None
    seen = threading.Event()
    lost: list[str] = []

    def emit(hint: Hint) -> None:
        if isinstance(hint, Exit) and hint.pid == child.pid:
            seen.set()
        elif isinstance(hint, Lost):
            lost.append(hint.reason)

    source = make()
    try:
        source.start(emit)
        source.watch(owner_of(child.pid))
        child.stdin.close()
        if seen.wait(timeout):
            return None
        if lost:
            return lost[-1]
        raise SourceError(
            f"no exit hint for a test child within {timeout:g} s (self-test timed out)"
        )
    finally:
        source.stop()
        child.stdin.close()
        child.wait()


def _try(candidate: Candidate, settings: Settings) -> tuple[Source, str]:
    reason = candidate.problem()
    if reason is not None:
        raise SourceError(reason)
    self_test(lambda: candidate.make(settings))
    source = candidate.make(settings)
    return source, f"{candidate.name}: self-test passed ({candidate.feature()})"


def pick(
    mode: str, *, poll_interval: float, ebpf_max_owners: int = Settings.ebpf_max_owners
) -> tuple[Source, str]:
    """The source to use (not yet started) and a one-line reason it was chosen.

    `mode` is one of MODES. An explicitly named source that cannot run raises SourceError;
    "auto" falls back, down to poll.
    """
    if mode not in MODES:
        raise SourceError(f"unknown source {mode!r}; choose one of {', '.join(MODES)}")
    if mode == PollSource.name:
        return PollSource(poll_interval), "poll: chosen explicitly"
    problems = []
    for candidate in CANDIDATES:
        if mode not in ("auto", candidate.name):
            continue
        try:
            source, reason = _try(candidate, Settings(poll_interval, ebpf_max_owners))
        except SourceError as err:
            if mode == candidate.name:
                raise SourceError(f"{candidate.name} unavailable: {err}") from err
            log.warning("source %s unavailable: %s", candidate.name, err)
            problems.append(f"{candidate.name} unavailable: {err}")
            continue
        log.info("source %s", reason)
        return source, reason
    reason = "poll: " + "; ".join(problems)
    log.info("source %s", reason)
    return PollSource(poll_interval), reason
