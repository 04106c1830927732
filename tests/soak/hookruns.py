"""What the soak's hooks left of their runs, and what their contract asks of them.

Each hook appends a line when it starts (`S <wall time> <uid> <dead owner>`) and one when it
ends (`E <wall time> <status>`) to a file of its own in its user's results directory, so
that how often it ran, as whom, when after its owner's death, and how many of one user's
ran at once, are read from the hooks themselves, not from the agent."""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

# The hook: $0 is its token, $1 its mode, $R its user's results directory. A "fail-once"
# hook fails its first run (its marker file is not there yet) and succeeds after it.
HOOK = r"""
f="$R/$0"
echo "S $(date +%s.%N) $(id -u) $EXITWATCH_DEAD_OWNER" >>"$f"
rc=0
case $1 in
fail-once) [ -e "$f.failed" ] || { : >"$f.failed"; rc=1; } ;;
slow) sleep "$SLOW" ;;
esac
echo "E $(date +%s.%N) $rc" >>"$f"
exit $rc
"""
RETRY_AT_LEAST = 0.4  # s between a failed run's end and the next start: reap's 0.5 s, less jitter
EXPECTED = {"ok": [0], "slow": [0], "fail-once": [1, 0]}  # each run's status, in order


@dataclass(frozen=True)
class Run:
    start: float
    uid: int
    owner: str
    end: float | None = None
    status: int | None = None


def runs(path: Path) -> list[Run]:
    """The runs a hook's file records, oldest first ([] if it never ran)."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    out: list[Run] = []
    for line in lines:
        words = line.split()
        if words[:1] == ["S"]:
            out.append(Run(float(words[1]), int(words[2]), words[3] if len(words) > 3 else ""))
        elif words[:1] == ["E"] and out and out[-1].end is None:
            last = out[-1]
            out[-1] = Run(last.start, last.uid, last.owner, float(words[1]), int(words[2]))
    return out


def judge(
    path: Path, mode: str, uid: int, owner: str, died: float | None, cancelled: bool
) -> list[str]:
    """What is wrong with the runs of one hook (a phrase each): a cancelled or live owner's
    hook never runs; a dead owner's runs exactly as its mode says, as its user, after the
    death, a failed run retried no sooner than the agent's retry delay."""
    done = runs(path)
    if died is None or cancelled:
        if not done:
            return []
        return [f"ran {len(done)} times, its owner {'alive' if died is None else 'cancelled it'}"]
    out = []
    statuses = [r.status for r in done]
    if statuses != EXPECTED[mode]:
        out.append(f"ran with statuses {statuses}, expected {EXPECTED[mode]}")
    if any(r.uid != uid for r in done) or (done and os.stat(path).st_uid != uid):
        out.append(f"ran as uids {sorted({r.uid for r in done})}, not {uid}")
    if any(r.owner != owner for r in done):
        out.append(f"was told its dead owner was {sorted({r.owner for r in done})}")
    if done and done[0].start < died:
        out.append(f"started {died - done[0].start:.3f} s before its owner was killed")
    for before, after in itertools.pairwise(done):
        if before.end is not None and after.start - before.end < RETRY_AT_LEAST:
            out.append(f"was retried {after.start - before.end:.3f} s after it failed")
    return out


def most_at_once(intervals: Sequence[tuple[float, float]]) -> int:
    """The most of `intervals` (start, end) that overlap at one moment."""
    edges = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    now = best = 0
    for _, step in edges:  # at a tie an end comes first: (t, -1) < (t, 1)
        now += step
        best = max(best, now)
    return best
