"""The agent's 2 s from SIGTERM to exit, and how it is shared, in one place: the parts that
stop side by side must not add up to more than the whole."""

# SIGTERM (or SIGINT) to exit, as exitwatch(8) promises; the unit's TimeoutStopSec is
# well above it, so systemd never has to SIGKILL an agent that keeps it.
EXIT = 2.0
# From the stop request to the end of the drain of the removals under way (an abandoned one
# is redone at the next start); the rest of EXIT is the interpreter's own teardown.
DEADLINE = 1.5
# The loop stops its parts (the exit source, each kind's discovery thread) side by side,
# and waits for each at most this long: a daemon thread given up on dies with the process.
PART = 1.0
