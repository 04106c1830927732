"""Leases and watchdogs under the installed unit, its sandbox and all (checks.py): what the
agent does while an owner lives, for an unprivileged user.

- spools: the package made /var/spool/exitwatch/{hooks,leases,watchdogs}, root's, 1733;
- watchdog_case: the user arms a watchdog (`exitwatch watchdog --timeout 2 --grace 1 --pid
  PID`) on two processes that never pet it, one of which ignores SIGTERM, and a third arms
  one on itself through the Python API and pets it. The agent ends the first with SIGTERM
  and the second with SIGKILL after the grace, each within its time and a margin, says so
  in the journal and the audit log, and leaves the third alone; their entries go with them;
- lease_case: the user's lease (`exitwatch while-alive --every 1 --pid PID`) runs as that
  user, about once a second, while its owner lives, and never again once it is SIGKILLed:
  its entry leaves the spool.

Each check waits with a deadline and says what it measured."""

from __future__ import annotations

import itertools
import json
import os
import pwd
import stat
import threading
import time

from guest import (
    Failed,
    journal,
    journal_cursor,
    kill,
    out,
    owner_of,
    read,
    spawn,
    status,
    wait_file,
    watch,
    within,
)
from kinds import REAP_DEADLINE, scratch

SPOOL = "/var/spool/exitwatch"
AUDIT = "/var/lib/exitwatch/audit.jsonl"
TIMEOUT, GRACE = 2.0, 1.0  # the watchdogs' (the smallest timeout is 1 s)
# Beyond the watchdog's own timing (it fires up to 20 ms late): the agent sees the new entry
# through inotify and signals through a pidfd, each a few Python steps under software
# emulation, beside an engine and whatever else the guest runs.
MARGIN = 3.0
EVERY = 1.0  # the lease's interval (the smallest allowed)
RECORDED = 10.0  # how long the journal and the audit log may lag behind a signal
WAIT = 60.0  # how long the unpetted ones are watched, their arming included
# A run that started before its owner's SIGKILL may still write its line after it, up to
# the agent's seeing the death (it then kills the run's process group).
LATE = 1.0
QUIET = 3.0  # seconds without a run that show a lease stopped (three of its intervals)

# Arms a watchdog on itself and pets it four times a timeout; exits 3 when the pet finds
# the watchdog gone (the agent removed it: its owner was judged dead).
PETTER = """
import os, sys, time
from exitwatch.alive import watchdog
dog = watchdog({timeout}, grace={grace}, reason="rig: petted")
with open("{d}/.petter", "w") as f:
    f.write(dog.id)
os.rename("{d}/.petter", "{d}/petter-id")
while dog.pet():
    time.sleep({timeout} / 4)
sys.exit(3)
"""


def spools() -> str:
    problems = []
    for name in ("hooks", "leases", "watchdogs"):
        path = f"{SPOOL}/{name}"
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            problems.append(f"{path} missing")
            continue
        mode = stat.S_IMODE(st.st_mode)
        if not stat.S_ISDIR(st.st_mode) or mode != 0o1733 or (st.st_uid, st.st_gid) != (0, 0):
            problems.append(
                f"{path}: {stat.filemode(st.st_mode)} ({mode:o}) {st.st_uid}:{st.st_gid}"
            )
    if problems:
        raise Failed("; ".join(problems))
    return "hooks, leases, watchdogs: directories, 1733 root:root"


def audit(pid: int, kind: str) -> list[dict]:
    """The audit log's lines of this kind about an owner whose pid is `pid`."""
    lines = [json.loads(line) for line in read(AUDIT).splitlines() if line.strip()]
    return [a for a in lines if a.get("kind") == kind and f":{pid}:" in a.get("owner", "")]


def watchdog_case(check, who: str) -> None:
    d = scratch(who, "watchdog")
    term = spawn("exec sleep 100000", user=who)  # SIGTERM ends it
    deaf = spawn("trap '' TERM; exec sleep 100001", user=who)  # SIGTERM ignored: SIGKILL
    petter = spawn(
        f"exec 2>{d}/log; exec python3 -c '{PETTER.format(timeout=TIMEOUT, grace=GRACE, d=d)}'",
        user=who,
    )
    cursor = journal_cursor()
    state: dict = {}

    def arm(proc) -> None:
        """`exitwatch watchdog` on proc as `who`: when it was run, when it returned, the id."""
        start = time.monotonic()
        wid = out(
            f"exitwatch watchdog --timeout {TIMEOUT:g} --grace {GRACE:g} --pid {proc.pid}",
            user=who,
        )
        state[proc.pid] = (start, time.monotonic(), wid)

    def armed() -> str:
        wait_file(f"{d}/petter-id", 60)
        state["petter"] = read(f"{d}/petter-id")
        arm(term)
        arm(deaf)
        return f"on pids {term.pid}, {deaf.pid} (never petted) and {petter.pid} (petted)"

    # Their deaths are watched from before they are armed, so that each is timed from its
    # own arming, whatever the other's took.
    watched, took = time.monotonic(), {}
    waiter = threading.Thread(
        target=lambda: took.update(
            watch({p.pid: (lambda p=p: p.poll() is not None) for p in (term, deaf)}, WAIT)
        )
    )
    waiter.start()
    check(f"{who}: watchdogs armed (exitwatch watchdog, and the Python API)", armed)
    waiter.join()
    for p in (term, deaf):
        if p.poll() is None:
            kill(p.pid)  # the next checks start clean
            p.wait()

    def unrecorded(pid: int, sig: int, wid: str) -> list[str]:
        """What the journal and the audit log lack of the watchdog's ending of `pid`."""
        lines = journal(cursor).splitlines()
        lacks = []
        if not any("ended by its watchdog" in x and f"ended owner pid {pid} " in x for x in lines):
            lacks.append("no 'ended by its watchdog' line of it in the journal")
        if sig == 9 and not any("SIGKILL sent" in x and f":{pid}:" in x for x in lines):
            lacks.append("no 'SIGKILL sent' line of it in the journal")
        ends = [a for a in audit(pid, "watchdog") if "ended by its watchdog" in a["death"]]
        if not ends or ends[0].get("extra", {}).get("watchdog", {}).get("id") != wid:
            lacks.append(f"no audit line of its watchdog {wid}: {ends}")
        return lacks

    def ended(proc, sig: int, least: float) -> str:
        if proc.pid not in state:
            raise Failed("it was never armed")
        start, armed_at, wid = state[proc.pid]
        if took[proc.pid] is None:
            raise Failed(f"pid {proc.pid} still ran {WAIT:g} s on")
        # Its death, from before its `exitwatch watchdog` ran (the earliest the timeout can
        # have started) and from when that returned (the latest).
        died = watched + took[proc.pid]
        since_start, since_armed = died - start, died - armed_at
        problems = []
        if proc.returncode != -sig:
            problems.append(f"it died of {proc.returncode}, not of signal {sig}")
        if since_start < least:
            problems.append(f"ended {since_start:.2f} s after it was armed: before {least:g} s")
        if since_armed > least + MARGIN:
            problems.append(f"ended {since_armed:.2f} s after it was armed: over {least:g} s")
        # The agent's record follows its signals (its loop writes it): waited for.
        try:
            within(RECORDED, lambda: not unrecorded(proc.pid, sig, wid), "the agent's record")
        except Failed:
            problems += unrecorded(proc.pid, sig, wid)
        if problems:
            raise Failed("; ".join(problems))
        return (
            f"pid {proc.pid}, signal {sig}, {since_armed:.2f} to {since_start:.2f} s after "
            "it was armed (from the end and the start of exitwatch watchdog)"
        )

    check(f"{who}: an unpetted watchdog ends its owner (SIGTERM)", ended, term, 15, TIMEOUT)
    check(
        f"{who}: an unpetted watchdog ends an owner deaf to SIGTERM (SIGKILL after the grace)",
        ended,
        deaf,
        9,
        TIMEOUT + GRACE,
    )

    def petted() -> str:
        # It lived through the others' ends; three timeouts more, still petting.
        end = time.monotonic() + 3 * TIMEOUT
        while time.monotonic() < end:
            if petter.poll() is not None:
                raise Failed(f"it exited {petter.returncode}: {read(f'{d}/log')[-300:]}")
            time.sleep(0.1)
        held = (owner_of(petter.pid) or {}).get("watchdogs")
        if not held:
            raise Failed(f"the agent shows no watchdog of it: {owner_of(petter.pid)}")
        fired = [f for f in status()["watchdogs"]["recent"] if f":{petter.pid}:" in f["owner"]]
        if fired:
            raise Failed(f"the agent says it fired: {fired}")
        return f"pid {petter.pid} alive and armed {3 * TIMEOUT:g} s after the others ended"

    check(f"{who}: a petted watchdog leaves its owner alone", petted)
    kill(petter.pid)
    petter.wait()
    ids = [state[p.pid][2] for p in (term, deaf) if p.pid in state] + [state.get("petter")]

    def left() -> list[str]:
        return [i for i in ids if not i or os.path.exists(f"{SPOOL}/watchdogs/{i}")]

    def entries_gone() -> str:
        try:
            took = within(REAP_DEADLINE, lambda: not left(), "the dead owners' watchdogs removed")
        except Failed as err:
            raise Failed(f"{err}: {left()} left") from None
        return f"{len(ids)} entries gone, the last {took:.2f} s after the petter's SIGKILL"

    check(f"{who}: dead owners' watchdogs leave the spool", entries_gone)


def lease_case(check, who: str) -> None:
    d = scratch(who, "lease")
    uid = pwd.getpwnam(who).pw_uid
    owner = spawn("exec sleep 100000", user=who)
    runs = f"{d}/runs"
    state: dict = {}

    def lines() -> list[list[str]]:
        try:
            return [line.split() for line in read(runs).splitlines()]
        except FileNotFoundError:
            return []

    def running() -> str:
        # Each run: its uid, when it ran and the owner it was told.
        state["id"] = out(
            f"cd {d} && exitwatch while-alive --every {EVERY:g} --pid {owner.pid} -- "
            f"/bin/sh -c 'echo $(id -u) $(date +%s.%N) $EXITWATCH_LEASE_OWNER >>{runs}'",
            user=who,
        )
        took = within(30, lambda: len(lines()) >= 4, "four runs of the lease")
        seen = lines()
        problems = []
        if any(line[0] != str(uid) for line in seen):
            problems.append(f"runs not as uid {uid}: {seen}")
        if any(len(line) < 3 or f":{owner.pid}:" not in line[2] for line in seen):
            problems.append(f"EXITWATCH_LEASE_OWNER not its owner {owner.pid}: {seen}")
        times = [float(line[1]) for line in seen]
        gaps = [b - a for a, b in itertools.pairwise(times)]
        # Each run is due `every` after the last was due, so a late run's next may come
        # sooner; but never more runs than the intervals they span.
        if len(times) - 1 > (times[-1] - times[0]) / EVERY + 1:
            problems.append(f"{len(times)} runs in {times[-1] - times[0]:.2f} s: {gaps}")
        if not (owner_of(owner.pid) or {}).get("leases"):
            problems.append(f"the agent shows no lease of it: {owner_of(owner.pid)}")
        if problems:
            raise Failed("; ".join(problems))
        return (
            f"lease {state['id']}: {len(seen)} runs as uid {uid} within {took:.1f} s, "
            f"{min(gaps):.2f} to {max(gaps):.2f} s apart"
        )

    check(f"{who}: a lease runs as its user while its owner lives", running)
    killed = time.time()
    kill(owner.pid)
    owner.wait()

    def stopped() -> str:
        if "id" not in state:
            raise Failed("no lease was made")
        entry = f"{SPOOL}/leases/{state['id']}"
        took = within(REAP_DEADLINE, lambda: not os.path.exists(entry), f"{entry} removed")
        count = len(lines())
        end = time.monotonic() + QUIET
        while time.monotonic() < end:
            if len(lines()) != count:
                raise Failed(f"it ran again after its entry was removed: {lines()[count:]}")
            time.sleep(0.1)
        late = [line for line in lines() if float(line[1]) > killed + LATE]
        if late:
            raise Failed(f"it ran after its owner's SIGKILL: {late}")
        if not audit(owner.pid, "lease"):
            raise Failed("no audit line of its removal")
        return f"entry gone {took:.2f} s after the owner's SIGKILL, no run since ({QUIET:g} s)"

    check(f"{who}: a SIGKILLed owner's lease stops and leaves the spool", stopped)
