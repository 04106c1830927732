"""The agent's 2 s from SIGTERM to exit, and how it is shared, in one place: the parts that
stop side by side must not add up to more than the whole. And how a long-running command
takes its signals (on_signals).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Mapping

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
    inside a queue.Queue or threading.Event call there, a handler that takes the same lock
    again hangs for good; and a signal that lands just before the main thread blocks in a
    lock waits for it to wake. The interpreter's C handler writes the signal's number to the
    wakeup fd at once, and the thread that reads it acts with nothing of the main thread's
    held. The handlers themselves do nothing.
    """
    wake, woken = os.pipe()
    os.set_blocking(woken, False)
    # Before the handlers: a signal that comes between the two is not lost.
    signal.set_wakeup_fd(woken, warn_on_full_buffer=False)
    for sig in actions:
        signal.signal(sig, _noop)

    def take() -> None:
        while True:
            for number in os.read(wake, 64):
                action = actions.get(signal.Signals(number))
                if action is not None:
                    action()

    threading.Thread(target=take, name="exitwatch-signals", daemon=True).start()


def _noop(*_: object) -> None:
    pass
