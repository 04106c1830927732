"""The agent's 2 s from SIGTERM to exit, and how it is shared, in one place: the parts that
stop side by side must not add up to more than the whole. And how a long-running command
takes its signals (on_signals).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable, Mapping

log = logging.getLogger(__name__)

# SIGTERM (or SIGINT) to exit, as exitwatch(8) promises; the unit's TimeoutStopSec is
# well above it, so systemd never has to SIGKILL an agent that keeps it.
EXIT = 2.0
# From the stop request to the end of the drain of the removals under way (an abandoned one
# is redone at the next start); the rest of EXIT is the interpreter's own teardown.
DEADLINE = 1.5
# The loop stops its parts (the exit source, each kind's discovery thread) side by side,
# and waits for each at most this long: a daemon thread given up on dies with the process.
PART = 1.0


def on_signals(actions: Mapping[signal.Signals, Callable[[], None]]) -> None:
    """From now on, run `actions[sig]()` on a thread of its own each time `sig` comes.

    A Python handler runs on the main thread, between two of its bytecodes, wherever it is:
    one that sets a threading.Event while that thread is inside the same Event's clear() or
    wait() takes the Event's lock again and hangs for good; and a signal that lands just
    before the main thread blocks in a lock or a queue is handled only when that wait ends.
    The interpreter's C handler writes the signal's number to the wakeup fd at once, and
    the thread that reads it acts with nothing of the main thread's held. The handlers
    themselves do nothing.
    """
    wake, woken = os.pipe()
    os.set_blocking(woken, False)
    # Before the handlers: once a handler is in place, its signal must find the fd.
    signal.set_wakeup_fd(woken, warn_on_full_buffer=False)
    # A child forked without exec would keep the handlers: its signals must not be acted on
    # here. (None is forked so now: the sources' self-test child was, until it became a
    # program of its own.)
    os.register_at_fork(after_in_child=_forget_wakeup_fd)
    for sig in actions:
        signal.signal(sig, _noop)
    by_number = {int(sig): action for sig, action in actions.items()}

    def take() -> None:
        while numbers := os.read(wake, 64):
            for number in numbers:
                action = by_number.get(number)
                if action is None:
                    continue
                try:
                    action()
                except Exception:  # the next signal must still be taken
                    log.exception("acting on signal %d failed", number)

    threading.Thread(target=take, name="exitwatch-signals", daemon=True).start()


def _noop(*_: object) -> None:
    pass


def _forget_wakeup_fd() -> None:
    with contextlib.suppress(ValueError):  # forked from a thread other than the main one
        signal.set_wakeup_fd(-1)
