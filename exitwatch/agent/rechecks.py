"""The owners the loop must judge again: those whose liveness could not be read now (a full
fd table, say: that proves nothing, so the hint is kept) and those the exit source failed
to watch (alive but unwatched, an owner's exit would bring no hint).

Only the agent's loop thread calls these, so this state needs no lock.
"""

from __future__ import annotations

import logging
import time

from exitwatch.owner import Owner

log = logging.getLogger(__name__)

DELAY = 1.0  # seconds until an owner that could not be judged or watched is tried again
NAMED = 5  # owners named in the log as they first fail, per round; the rest are counted


class Rechecks:
    """What to try again at `due` (monotonic), and how often each owner failed in a row."""

    def __init__(self) -> None:
        self.due: float | None = None
        self._judge: dict[Owner, tuple[float, int | None]] = {}  # the hint's time and status
        self._tries: dict[Owner, int] = {}  # bounds `exitwatch reap`'s wait
        self._rewatch: set[Owner] = set()
        self._new = 0  # owners that began failing this round

    def __bool__(self) -> bool:
        return bool(self._judge)

    def unreadable(self, owner: Owner, at: float, status: int | None, err: Exception) -> None:
        """`owner`'s liveness could not be read: judge it again DELAY from now, with the
        hint's time `at` and wait `status` kept."""
        tries = self._tries.get(owner, 0)
        if tries == 0 and owner not in self._judge and self._name():
            if isinstance(err, OSError):
                log.warning(
                    "cannot tell whether owner %s lives (%s); checking again in %g s",
                    owner,
                    err.strerror or err,
                    DELAY,
                )
            else:  # not the kernel saying no but a bug: said loudly, judged again all the same
                log.error("cannot tell whether owner %s lives", owner, exc_info=err)
        self._judge.setdefault(owner, (at, status))
        self._tries[owner] = tries + 1
        self._soon()

    def unwatched(self, owner: Owner, source: str, err: Exception) -> None:
        """The source failed to watch `owner`: watch it again DELAY from now."""
        if owner not in self._rewatch and self._name():
            why = getattr(err, "strerror", None) or err
            log.warning(
                "%s cannot watch owner %s (%s); trying again in %g s", source, owner, why, DELAY
            )
        self._rewatch.add(owner)
        self._soon()

    def judged(self, owner: Owner) -> None:
        """`owner`'s liveness was read: it starts afresh."""
        self._tries.pop(owner, None)

    def watched(self, owner: Owner) -> None:
        """`owner` is no longer to be watched again (watched, or unwatched for good)."""
        self._rewatch.discard(owner)

    def waiting(self, owner: Owner) -> bool:
        """Whether `owner` waits to be judged again."""
        return owner in self._judge

    def take(self) -> tuple[set[Owner], dict[Owner, tuple[float, int | None]]]:
        """The owners to watch again and those to judge again, now due; the next round
        starts empty."""
        rewatch, judge = self._rewatch, self._judge
        self._rewatch, self._judge, self.due = set(), {}, None
        if self._new > NAMED:
            log.warning("%d more owners could not be judged or watched", self._new - NAMED)
        self._new = 0
        return rewatch, judge

    def forget(self, owner: Owner) -> None:
        """`owner` holds nothing any more: nothing is tried again for it."""
        self._tries.pop(owner, None)

    def exhausted(self, attempts: int) -> bool:
        """Whether every owner waiting has failed `attempts` times (`exitwatch reap` stops
        waiting then, and names them)."""
        return all(self._tries.get(o, 0) >= attempts for o in self._judge)

    def problem(self) -> str | None:
        """One line naming the owners still waiting, or None."""
        if not self._judge:
            return None
        return (
            f"could not tell whether {len(self._judge)} owners live, {min(self._judge)} the first"
        )

    def _name(self) -> bool:
        self._new += 1
        return self._new <= NAMED

    def _soon(self) -> None:
        if self.due is None:
            self.due = time.monotonic() + DELAY
