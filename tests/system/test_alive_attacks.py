"""The attacks of issue 31 on leases and watchdogs, against a real agent (without an
engine: its only work is the spools), real users (`exitwatch-test`, A, and a user made for
the module, B) and real processes and signals. Each test says which rule it attacks."""

from __future__ import annotations

import itertools
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from exitwatch import alive
from exitwatch.alive import LEASE_FILE, WATCHDOG_FILE, watchdog_id
from exitwatch.kinds.watchdogs.kind import Watchdogs
from exitwatch.owner import Owner, owner_of

from support.hooks import REPO
from support.procs import state, wait_for
from support.users import SYSTEM_PYTHON, as_user, setpriv_argv, temporary_user
from support.wrapper import env_for, run

DEADLINE = 30.0  # for a correct agent on a loaded machine
PROMPT = 2.0  # how late another user's lease may run while one user's leases hog the agent


@pytest.fixture(scope="module")
def other_user() -> Iterator:
    with temporary_user("exitwatch-w") as user:
        yield user


@pytest.fixture
def procs() -> Iterator:
    """Start processes (as a user, or root); each killed and reaped after the test."""
    started: list[subprocess.Popen] = []

    def start(argv: list[str], **popen) -> subprocess.Popen:
        started.append(subprocess.Popen(argv, **({"stdin": subprocess.DEVNULL} | popen)))
        return started[-1]

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def sleeper_as(procs, user) -> tuple[subprocess.Popen, Owner]:
    proc = procs(setpriv_argv(user, "sleep", "1000"))
    # The start time is fixed at the fork; the uids are the user's once setpriv ran.
    wait_for(lambda: os.stat(f"/proc/{proc.pid}").st_uid == user.pw_uid, 10, "setpriv")
    return proc, owner_of(proc.pid)


# Puts an entry into a spool as the calling user, the way alive.py does (add_entry), but
# with whatever body the attacker likes: alive.watchdog's own checks are bypassed.
_ADD = """
import sys
sys.path.insert(0, sys.argv[1])
from exitwatch.contract import add_entry
add_entry(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5].encode())
"""


def add_as(user, spool: Path, entry_id: str, file: str, content: dict) -> None:
    """Put `content` into `spool` as entry `entry_id` holding `file`, as `user` (or root
    for None)."""
    args = [_ADD, str(REPO), str(spool), entry_id, file, json.dumps(content)]
    argv = [SYSTEM_PYTHON, "-I", "-S", "-c", *args]
    done = subprocess.run(
        argv if user is None else setpriv_argv(user, *argv), capture_output=True, cwd="/"
    )
    assert done.returncode == 0, done.stderr.decode()


def dog(owner: Owner, timeout: float = 1.0, grace: float = 0.0, **over: object) -> dict:
    return {
        "owner": str(owner),
        "timeout": timeout,
        "grace": grace,
        "created": time.time(),
        "reason": "test",
    } | over


def lease(owner: Owner, argv: list[str], every: float = 1.0, **over: object) -> dict:
    return {
        "owner": str(owner),
        "argv": argv,
        "cwd": "/",
        "env": {},
        "every": every,
        "timeout": 30,
        "created": time.time(),
    } | over


def entry_id(n: int) -> str:
    return f"{n:032x}"


def gone(proc: subprocess.Popen) -> bool:
    return proc.poll() is not None


# -- only the owner's own user (or root) may arm a watchdog on it ----------------------------


def test_another_users_watchdog_never_ends_the_owner(
    alive_spools, alive_agent, procs, attacker, other_user
):
    """B writes a watchdog naming A's process by hand (alive.watchdog would refuse it): it
    is refused at its timeout and A's process lives on. A's own, the same, ends it."""
    dogs = alive_spools.watchdogs
    agent = alive_agent
    victim, owner = sleeper_as(procs, attacker)
    add_as(other_user, dogs, watchdog_id(owner, other_user.pw_uid), WATCHDOG_FILE, dog(owner))
    wait_for(lambda: "refused: its owner" in agent.text(), DEADLINE, "B's watchdog refused")
    assert not gone(victim)
    assert agent.status()["watchdogs"]["refused"] == 1, agent.status()["watchdogs"]
    # The same watchdog, A's own: it fires.
    add_as(attacker, dogs, watchdog_id(owner, attacker.pw_uid), WATCHDOG_FILE, dog(owner))
    wait_for(lambda: gone(victim), DEADLINE, "A's own watchdog to end A's process")
    assert victim.returncode == -signal.SIGTERM
    # Told to the audit log as a removal is, with the watchdog's uid.
    audit = Path(agent.flag("--audit-log"))
    lines = [json.loads(line) for line in audit.read_text().splitlines()]
    ended = [x for x in lines if x.get("extra", {}).get("watchdog")]
    assert [x["extra"]["watchdog"]["uid"] for x in ended] == [attacker.pw_uid], lines
    assert ended[0]["owner"] == str(owner) and "SIGTERM" in ended[0]["result"], ended


def test_a_setuid_process_is_never_ended_by_its_users_watchdog(
    alive_spools, alive_agent, procs, attacker, tmp_path
):
    """A runs a setuid-root program (its effective uid 0) and arms a watchdog on it by
    hand: A could not signal it, and neither does the agent for A."""
    dogs = alive_spools.watchdogs
    where = Path(tempfile.mkdtemp(prefix="exitwatch-suid-", dir="/var/tmp"))
    try:
        os.chmod(where, 0o755)
        suid = where / "sleep"
        shutil.copy("/bin/sleep", suid)
        os.chmod(suid, 0o4755)
        proc = procs(setpriv_argv(attacker, str(suid), "1000"))
        wait_for(lambda: _euid(proc.pid) == 0, 10, "the setuid program to run")
        owner = owner_of(proc.pid)
        agent = alive_agent
        add_as(attacker, dogs, watchdog_id(owner, attacker.pw_uid), WATCHDOG_FILE, dog(owner))
        wait_for(lambda: "refused: its owner" in agent.text(), DEADLINE, "the watchdog refused")
        assert not gone(proc)
    finally:
        shutil.rmtree(where)


def _session(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[3])
    except FileNotFoundError:
        return None


def _euid(pid: int) -> int | None:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[2])
    return None


# -- a live petting owner is never touched ---------------------------------------------------

# Pets the watchdog file $1 every 0.2 s, with `touch -d` in the past, in the future and now
# in turn (a pet is the file's change time, which the kernel sets), counting into $2.
_PETTER = """
i=0
while :; do
    case $((i % 3)) in
        0) touch -d '1 hour ago' "$1" ;;
        1) touch -d 'next year' "$1" ;;
        *) touch "$1" ;;
    esac
    i=$((i + 1)); echo $i > "$2.tmp"; mv "$2.tmp" "$2"
    sleep 0.2
done
"""


def _count(path: Path) -> int:
    try:
        return int(path.read_text() or 0)
    except FileNotFoundError:
        return 0


def test_a_petting_owner_lives_whatever_mtime_its_pets_give(
    alive_spools, alive_agent, procs, attacker, out
):
    """A pets its watchdog (1 s) every 0.2 s with mtimes an hour back, a year ahead and
    now: for 30 pets (six timeouts) it lives; once the pets stop, it is ended."""
    dogs = alive_spools.watchdogs
    agent = alive_agent
    victim, owner = sleeper_as(procs, attacker)
    wid = watchdog_id(owner, attacker.pw_uid)
    add_as(attacker, dogs, wid, WATCHDOG_FILE, dog(owner, timeout=1.0))
    wait_for(lambda: agent.status()["watchdogs"]["armed"] == 1, DEADLINE, "it armed")
    count = out / "pets"
    petter = as_user(attacker, _PETTER, str(dogs / wid / WATCHDOG_FILE), str(count))
    try:
        wait_for(lambda: _count(count) >= 30 or gone(victim), DEADLINE, "30 pets")
        assert not gone(victim), agent.text()
    finally:
        petter.kill()
        petter.wait()
    wait_for(lambda: gone(victim), DEADLINE, "the unpetted owner to be ended")


# -- a pid reused before the timeout is never killed; a zombie is not an owner to end -----------


def _reuse_pid(user, pid: int, procs) -> subprocess.Popen | None:
    """A new process of `user` with the pid `pid` (ns_last_pid), or None when another fork
    on the host took it first."""
    Path("/proc/sys/kernel/ns_last_pid").write_text(str(pid - 1))
    proc = procs(setpriv_argv(user, "sleep", "1000"))
    return proc if proc.pid == pid else None


def test_a_pid_reused_before_the_timeout_is_never_killed(
    alive_spools, alive_agent, procs, attacker
):
    """A arms a watchdog (1.5 s) on its process, which dies at once; its pid is taken by a
    new process of A's before the timeout: the agent removes the dead owner's watchdog and
    the new process lives on."""
    dogs = alive_spools.watchdogs
    agent = alive_agent
    for _ in range(20):
        first, owner = sleeper_as(procs, attacker)
        wid = watchdog_id(owner, attacker.pw_uid)
        add_as(attacker, dogs, wid, WATCHDOG_FILE, dog(owner, timeout=1.5))
        first.kill()
        first.wait()
        reuser = _reuse_pid(attacker, owner.pid, procs)
        if reuser is not None:
            break
    else:
        pytest.skip("the host's forks took the pid every time")
    wait_for(lambda: not (dogs / wid).exists(), DEADLINE, "the dead owner's watchdog removed")
    assert not gone(reuser), agent.text()
    assert "ended by its watchdog" not in agent.text()


def test_a_zombie_owner_is_dead_not_ended(alive_spools, alive_agent, attacker):
    """A's process has exited, unwaited for: its watchdog is a dead owner's, removed, and
    nothing is signalled."""
    dogs = alive_spools.watchdogs
    agent = alive_agent
    zombie = subprocess.Popen(setpriv_argv(attacker, "true"))
    try:
        wait_for(lambda: state(zombie.pid) == "Z", 10, "the zombie")
        owner = owner_of(zombie.pid)
        wid = watchdog_id(owner, attacker.pw_uid)
        add_as(attacker, dogs, wid, WATCHDOG_FILE, dog(owner, timeout=1.0))
        wait_for(lambda: not (dogs / wid).exists(), DEADLINE, "the zombie's watchdog removed")
        assert "ended by its watchdog" not in agent.text()
    finally:
        zombie.wait()


# -- a watchdog never fires while the agent cannot read the owner ----------------------------


def test_no_watchdog_fires_while_the_agents_fd_table_is_full(
    alive_spools, alive_agent, procs, attacker
):
    """The agent's fd limit is cut to 3 (every open fails with EMFILE) before its watchdog's
    timeout: it says it cannot look, and fires only once it can again."""
    dogs = alive_spools.watchdogs
    agent = alive_agent
    victim, owner = sleeper_as(procs, attacker)
    add_as(attacker, dogs, watchdog_id(owner, attacker.pw_uid), WATCHDOG_FILE, dog(owner, 3.0))
    wait_for(lambda: agent.status()["watchdogs"]["armed"] == 1, DEADLINE, "it armed")
    limits = resource.prlimit(agent.pid, resource.RLIMIT_NOFILE)
    resource.prlimit(agent.pid, resource.RLIMIT_NOFILE, (3, limits[1]))
    try:
        wait_for(lambda: "cannot look now, so it does not fire" in agent.text(), DEADLINE, "EMFILE")
        assert not gone(victim), agent.text()
    finally:
        resource.prlimit(agent.pid, resource.RLIMIT_NOFILE, limits)
    wait_for(lambda: gone(victim), DEADLINE, "the watchdog to fire once the agent can look")
    assert agent.alive(), agent.text()


# -- a lease runs as its user, never after its owner's death, never delayed by another's ---------

# Adds one lease per id (argv[4:]) as the calling user, each the same body (argv[3]).
_ADD_MANY = """
import sys
sys.path.insert(0, sys.argv[1])
from exitwatch.contract import add_entry
for entry_id in sys.argv[4:]:
    add_entry(sys.argv[2], entry_id, "lease.json", sys.argv[3].encode())
"""

# Replaces the file $2 of entry directory $1 by a rename over it, as its user does: the
# agent sees no event in the spool.
_REPLACE = 'printf %s "$3" > "$1/.new" && chmod 600 "$1/.new" && mv "$1/.new" "$1/$2"'


def _lines(path: Path) -> list[str]:
    try:
        return path.read_text().split()
    except FileNotFoundError:
        return []


def test_a_lease_never_runs_after_its_owners_death(alive_spools, alive_agent, procs, attacker, out):
    """A's lease (every 1 s) runs a command that outlasts it: the run under way is killed
    as the owner dies, and none starts after; the lease is removed."""
    leases = alive_spools.leases
    agent = alive_agent
    owner_proc, owner = sleeper_as(procs, attacker)
    runs = out / "runs"
    script = f"echo $$ >> {runs}; exec sleep 1000"
    add_as(attacker, leases, entry_id(1), LEASE_FILE, lease(owner, ["sh", "-c", script]))
    first = int(wait_for(lambda: _lines(runs), DEADLINE, "the first run")[0])
    assert os.stat(f"/proc/{first}").st_uid == attacker.pw_uid  # as its user
    owner_proc.kill()
    owner_proc.wait()
    wait_for(lambda: state(first) is None, DEADLINE, "the run under way to be killed")
    wait_for(lambda: not (leases / entry_id(1)).exists(), DEADLINE, "the lease removed")
    assert _lines(runs) == [str(first)], agent.text()


def test_a_lease_file_replaced_by_its_user_runs_its_new_command(
    alive_spools, alive_agent, procs, attacker, out
):
    """A replaces its lease's file (a rename over it, which raises no event in the spool)
    with another command: the new one runs at its interval, as a changed lease; the lease
    neither stops running nor reads as healthy meanwhile."""
    leases = alive_spools.leases
    agent = alive_agent
    _, owner = sleeper_as(procs, attacker)
    log = out / "log"
    old = lease(owner, ["sh", "-c", f"echo old >> {log}"])
    add_as(attacker, leases, entry_id(2), LEASE_FILE, old)
    wait_for(lambda: "old" in _lines(log), DEADLINE, "the lease to run")
    new = json.dumps(lease(owner, ["sh", "-c", f"echo new >> {log}"]))
    done = as_user(attacker, _REPLACE, str(leases / entry_id(2)), LEASE_FILE, new)
    assert done.wait(10) == 0
    wait_for(lambda: "new" in _lines(log), DEADLINE, f"the new command to run:\n{agent.text()}")


def test_one_users_flood_of_leases_never_delays_anothers(
    alive_spools, alive_agent, procs, attacker, other_user, out
):
    """A floods the spool with 400 leases of 1 s (8 of A's run at once, the rest wait):
    B's lease of 1 s still runs every second, give or take PROMPT."""
    leases = alive_spools.leases
    agent = alive_agent
    _, a_owner = sleeper_as(procs, attacker)
    _, b_owner = sleeper_as(procs, other_user)
    ids = [entry_id(1000 + n) for n in range(400)]
    body = json.dumps(lease(a_owner, ["true"]))
    argv = [SYSTEM_PYTHON, "-I", "-S", "-c", _ADD_MANY, str(REPO), str(leases), body, *ids]
    subprocess.run(setpriv_argv(attacker, *argv), check=True, cwd="/")
    wait_for(lambda: agent.status()["leases"]["runs"] >= 400, DEADLINE, "A's flood under way")
    stamps = out / "b"
    b_lease = lease(b_owner, ["sh", "-c", f"date +%s.%N >> {stamps}"])
    add_as(other_user, leases, entry_id(3), LEASE_FILE, b_lease)
    wait_for(lambda: len(_lines(stamps)) >= 8, 8 * (1 + PROMPT) + DEADLINE, "8 runs of B's")
    times = [float(t) for t in _lines(stamps)]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert max(gaps) <= 1 + PROMPT, (gaps, agent.status()["leases"])


# -- the agent's reload, and `exitwatch reap` ---------------------------------------------------


def test_a_reload_during_the_grace_still_kills_the_owner_at_its_end(
    alive_spools, alive_agent, procs, attacker
):
    """A's process ignores SIGTERM; its watchdog (1 s, grace 3 s) fires. A then arms it
    again for 60 s (the agent ignores that: the owner is being ended), and the agent is
    reloaded (SIGHUP) within the grace: SIGKILL still comes at the grace's end, not a
    whole new timeout later."""
    dogs = alive_spools.watchdogs
    agent = alive_agent
    victim = procs(setpriv_argv(attacker, "sh", "-c", "trap '' TERM; exec sleep 1000"))
    wait_for(lambda: _euid(victim.pid) == attacker.pw_uid, 10, "setpriv")
    owner = owner_of(victim.pid)
    wid = watchdog_id(owner, attacker.pw_uid)
    add_as(attacker, dogs, wid, WATCHDOG_FILE, dog(owner, timeout=1.0, grace=3.0))
    wait_for(lambda: "ended by its watchdog" in agent.text(), DEADLINE, "the watchdog to fire")
    fired = time.monotonic()
    again = json.dumps(dog(owner, timeout=60.0, grace=3.0))
    assert as_user(attacker, _REPLACE, str(dogs / wid), WATCHDOG_FILE, again).wait(10) == 0
    agent.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: "config reloaded" in agent.text(), DEADLINE, "the reload")
    wait_for(lambda: gone(victim), DEADLINE, f"SIGKILL after the grace:\n{agent.text()}")
    assert victim.returncode == -signal.SIGKILL
    assert time.monotonic() - fired < 3.0 + PROMPT + 5.0


def test_exitwatch_reap_removes_dead_owners_leases_and_watchdogs_only(
    alive_spools, procs, attacker, tmp_path, out
):
    """`exitwatch reap` with leases and watchdogs of a dead owner and of a live one: the
    dead one's go, the live one's stay, nothing is signalled and no lease runs."""
    leases, dogs = alive_spools.leases, alive_spools.watchdogs
    live_proc, live = sleeper_as(procs, attacker)
    dead_proc, dead = sleeper_as(procs, attacker)
    dead_proc.kill()
    dead_proc.wait()
    for n, owner in ((1, live), (2, dead)):
        add_as(attacker, dogs, watchdog_id(owner, attacker.pw_uid), WATCHDOG_FILE, dog(owner))
        argv = ["sh", "-c", f"touch {out}/ran-{n}"]
        add_as(attacker, leases, entry_id(n), LEASE_FILE, lease(owner, argv))
    config = tmp_path / "reap.toml"
    config.write_text(
        "kill_leftovers = false\nfind_engines = false\n[containers]\nenabled = false\n"
        "[hooks]\nenabled = false\n"
    )
    argv = [
        *(sys.executable, "-m", "exitwatch", "reap", "--config", str(config)),
        *("--workdir-root", str(tmp_path), "--audit-log", ""),
        *("--lease-dir", str(leases), "--watchdog-dir", str(dogs)),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert (leases / entry_id(1)).exists() and not (leases / entry_id(2)).exists(), done.stderr
    assert (dogs / watchdog_id(live, attacker.pw_uid)).exists()
    assert not (dogs / watchdog_id(dead, attacker.pw_uid)).exists(), done.stderr
    assert not gone(live_proc)
    assert not list(out.iterdir())


# -- the watchdog's id is another user's to take --------------------------------------------

_ARM = """
import sys
sys.path.insert(0, sys.argv[1])
from exitwatch.alive import watchdog
print(watchdog(float(sys.argv[3]) if sys.argv[3:] else 5.0, pid=int(sys.argv[2])).id)
"""


@pytest.mark.xfail(
    strict=True,
    reason="issue 31 finding, not fixed: watchdog_id() is hash(uid, owner), which anyone can "
    "compute; a directory of B's by that name makes A's arming fail (PermissionError)",
)
def test_another_user_cannot_keep_a_user_from_arming_a_watchdog(
    alive_spools, procs, attacker, other_user
):
    """The watchdog's id is a hash of the user and the owner, both of which anyone can read
    (/proc/PID/stat, /etc/machine-id): B makes that directory in the spool before A arms.
    A must still be able to arm a watchdog on A's own process (`exitwatch run --max-time`
    fails to start without one)."""
    dogs = alive_spools.watchdogs
    _, owner = sleeper_as(procs, attacker)
    squat = watchdog_id(owner, attacker.pw_uid)
    subprocess.run(setpriv_argv(other_user, "mkdir", "-m", "700", str(dogs / squat)), check=True)
    argv = [SYSTEM_PYTHON, "-I", "-S", "-c", _ARM, str(REPO), str(owner.pid)]
    done = subprocess.run(setpriv_argv(attacker, *argv), capture_output=True, text=True, cwd="/")
    assert done.returncode == 0, done.stderr[-400:]


# -- `exitwatch run --max-time` with --idle-timeout: re-armed for what is left ------------------


def test_a_runs_max_time_rearmed_for_what_is_left_ends_it_then(alive_spools, alive_agent, bases):
    """`exitwatch run --max-time 8 --idle-timeout 7.5`: CMD writes at 1 s, when the maximum
    time becomes the nearer end; the wrapper arms the watchdog again for the 7 s left. The
    run ends at about 8 s (the re-arming counts as a pet when it was made), not when the
    agent next looked at the file (the old timeout, 7.5 s) plus 7 s."""
    agent = alive_agent
    script = "echo start; sleep 1; echo more; exec sleep 1000"
    env = env_for(bases)
    started = time.monotonic()
    done = run(["--max-time", "8", "--idle-timeout", "7.5", "--", "sh", "-c", script], env)
    took = time.monotonic() - started
    assert "ended by its watchdog" in agent.text(), (done.stderr, agent.text())
    assert took < 8 + 3.0, (took, agent.text())


# -- a thousand firings at once --------------------------------------------------------------

# Starts argv[2] processes and arms a watchdog (argv[3] s, grace argv[4] s) on each through
# alive.watchdog, as the calling user; says "armed", then waits for its stdin to close.
_ARM_MANY = """
import subprocess, sys
sys.path.insert(0, sys.argv[1])
from exitwatch.alive import watchdog
kids = [subprocess.Popen(["sleep", "1000"]) for _ in range(int(sys.argv[2]))]
for kid in kids:
    watchdog(float(sys.argv[3]), pid=kid.pid, grace=float(sys.argv[4]))
print("armed", flush=True)
sys.stdin.read()
for kid in kids:
    kid.kill()
    kid.wait()
"""


def test_a_thousand_firings_at_once_never_stop_the_watchdogs(
    alive_spools, alive_agent, procs, attacker, other_user
):
    """A and B each arm 600 watchdogs (2 s, grace 4 s) on as many processes of theirs, all
    due at once: the agent holds a pidfd of each fired owner through its grace, more than
    1024 descriptors. Every grace runs out (select() takes no fd past 1023), and a
    watchdog armed after them still fires."""
    agent = alive_agent
    armers = []
    for user in (attacker, other_user):
        argv = [SYSTEM_PYTHON, "-I", "-S", "-c", _ARM_MANY, str(REPO), "600", "2", "4"]
        armers.append(
            procs(setpriv_argv(user, *argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd="/")
        )
    try:
        for armer in armers:
            assert armer.stdout.readline() == b"armed\n"
        wait_for(lambda: agent.status()["watchdogs"]["fired"] == 1200, DEADLINE, "the 1200 firings")
        # Due once every grace has run out (4 s after its firing, all made by now).
        late, owner = sleeper_as(procs, attacker)
        later = dog(owner, timeout=6.0)
        add_as(
            attacker,
            alive_spools.watchdogs,
            watchdog_id(owner, attacker.pw_uid),
            WATCHDOG_FILE,
            later,
        )
        wait_for(lambda: gone(late), DEADLINE, f"a later watchdog to fire:\n{agent.text()[-3000:]}")
        assert "Traceback" not in agent.text(), agent.text()[-3000:]
    finally:
        for armer in armers:
            armer.stdin.close()


@pytest.mark.xfail(
    strict=True,
    reason="issue 31 finding, not fixed: a lease run's process group is killed at its owner's "
    "death, but a child that called setsid has left it (as for hooks, spawn.run_as)",
)
def test_nothing_a_lease_ran_outlives_its_owner(alive_spools, alive_agent, procs, attacker, out):
    """A's lease runs a command that starts a child in a session of its own (setsid): at the
    owner's death the run is killed, and so must be what it started."""
    leases = alive_spools.leases
    owner_proc, owner = sleeper_as(procs, attacker)
    pids = out / "pids"
    script = f"setsid sleep 1000 & echo $! >> {pids}; exec sleep 1000"
    add_as(attacker, leases, entry_id(4), LEASE_FILE, lease(owner, ["sh", "-c", script]))
    escaped = int(wait_for(lambda: _lines(pids), DEADLINE, "the first run")[0])
    try:
        wait_for(lambda: _session(escaped) == escaped, 10, "the child in a session of its own")
        owner_proc.kill()
        owner_proc.wait()
        wait_for(lambda: state(escaped) is None, 10, "what the run started to be killed")
    finally:
        if state(escaped) is not None:
            os.kill(escaped, signal.SIGKILL)


def test_a_watchdog_armed_again_with_a_shorter_timeout_fires_at_it(
    alive_spools, alive_agent, procs, attacker
):
    """A arms a watchdog of 45 s on its process, then again of 1 s (`exitwatch watchdog
    --timeout 1`: "a new timeout, and a pet"): it fires about a second later, not at 45 s."""
    agent = alive_agent
    victim, owner = sleeper_as(procs, attacker)
    for timeout in ("45", "1"):
        argv = [SYSTEM_PYTHON, "-I", "-S", "-c", _ARM, str(REPO), str(owner.pid), timeout]
        done = subprocess.run(setpriv_argv(attacker, *argv), capture_output=True, cwd="/")
        assert done.returncode == 0, done.stderr
        wait_for(lambda: agent.status()["watchdogs"]["armed"] == 1, DEADLINE, "it armed")
    wait_for(lambda: gone(victim), 15, "the watchdog armed again for 1 s to fire")


# -- symlinks, FIFOs and hardlinks in the lease and watchdog spools -------------------------

# Makes, as the user, in spool $1: entry $2 whose file ($5) is a FIFO, entry $3 whose file
# is a symlink to a good file of the user's ($6), entry $4 whose file is a hard link to it;
# each made under a dot name and renamed into place, as add_entry does.
_PLANT_BAD = """
set -e
cd "$1"
mkdir -m 700 ".$2" ".$3" ".$4"
mkfifo -m 600 ".$2/$5"
ln -s "$6" ".$3/$5"
ln "$6" ".$4/$5"
mv ".$2" "$2"; mv ".$3" "$3"; mv ".$4" "$4"
"""


@pytest.mark.parametrize("spool_kind", ["lease", "watchdog"])
def test_fifos_symlinks_and_hardlinks_in_the_spools_are_refused(
    alive_spools, alive_agent, procs, attacker, out, spool_kind
):
    """A's entries whose file is a FIFO (the agent must not block on it), a symlink and a
    hard link, to a good file of A's: each refused by name; A's good entry beside them
    acts (a lease runs, a watchdog fires)."""
    leases, dogs = alive_spools.leases, alive_spools.watchdogs
    spool, file = (leases, LEASE_FILE) if spool_kind == "lease" else (dogs, WATCHDOG_FILE)
    agent = alive_agent
    victim, owner = sleeper_as(procs, attacker)
    ran = out / "ran"
    content = (
        lease(owner, ["touch", str(ran)]) if spool_kind == "lease" else dog(owner, timeout=2.0)
    )
    good = out / "good.json"
    good.write_text(json.dumps(content))
    os.chown(good, attacker.pw_uid, attacker.pw_gid)
    os.chmod(good, 0o600)
    fifo, link, hard = entry_id(11), entry_id(12), entry_id(13)
    made = as_user(attacker, _PLANT_BAD, str(spool), fifo, link, hard, file, str(good))
    assert made.wait(10) == 0
    for name, why in [
        (fifo, f"its {file} is a FIFO"),
        (link, f"its {file} is a symlink"),
        (hard, f"its {file} has 2 links, not 1"),
    ]:
        wait_for(lambda n=name, w=why: f"{n}: refused: {w}" in agent.text(), DEADLINE, why)
    wait_for(lambda: not ran.exists() and not gone(victim), 1, "nothing acted")
    add_as(attacker, spool, entry_id(14), file, content)
    if spool_kind == "lease":
        wait_for(ran.exists, DEADLINE, "the good lease to run")
    else:
        wait_for(lambda: gone(victim), DEADLINE, "the good watchdog to fire")


def test_a_look_at_a_pet_never_follows_a_symlink_in_place_of_the_entry(
    alive_spools, procs, attacker, tmp_path
):
    """A moves its armed watchdog's directory out of the spool and leaves a symlink to it
    in its place (a user owns their entry's name in the sticky spool): the agent's look at
    the pet, as root, must not follow it. The file is the very one armed, so only the
    path says so: the look fails (nothing proved, nothing fired; the listing's Gone drops
    it), never pets through the link."""
    dogs = alive_spools.watchdogs
    _, owner = sleeper_as(procs, attacker)
    wid = watchdog_id(owner, attacker.pw_uid)
    add_as(attacker, dogs, wid, WATCHDOG_FILE, dog(owner, timeout=60.0))
    kind = Watchdogs(str(dogs))
    (entry,) = kind.scan().resources
    with kind._cond:
        kind._arm(entry)
        assert kind._stamp(entry) is not None  # the file itself, through its directory
    away = Path(tempfile.mkdtemp(prefix="exitwatch-away-", dir=dogs.parent))
    try:
        os.chown(away, attacker.pw_uid, attacker.pw_gid)
        swap = 'mv "$1/$2" "$3/" && ln -s "$3/$2" "$1/$2"'
        moved = as_user(attacker, swap, str(dogs), wid, str(away))
        assert moved.wait(10) == 0
        with kind._cond:
            assert kind._stamp(entry) is None
    finally:
        shutil.rmtree(away)


def test_roots_pet_never_follows_a_symlink_a_user_left_in_the_spool(
    alive_spools, procs, attacker, tmp_path
):
    """Root arms a watchdog on a process of A's, and cancels it; A leaves a symlink by its
    id (anyone can compute it) to a directory of A's holding a watchdog.json. Root's pet
    (`exitwatch watchdog --pet --pid P`) must not follow it: A's file is left untouched,
    and the pet says there is no watchdog."""
    dogs = alive_spools.watchdogs
    _, owner = sleeper_as(procs, attacker)
    armed = alive.watchdog(60.0, pid=owner.pid)
    assert armed.cancel()
    theirs = Path(tempfile.mkdtemp(prefix="exitwatch-theirs-"))
    try:
        (theirs / WATCHDOG_FILE).write_text("{}")
        os.utime(theirs / WATCHDOG_FILE, (0, 0))
        for path in (theirs, theirs / WATCHDOG_FILE):
            os.chown(path, attacker.pw_uid, attacker.pw_gid)
        link = as_user(attacker, 'ln -s "$2" "$1"', str(dogs / armed.id), str(theirs))
        assert link.wait(10) == 0
        assert not alive.find_watchdog(owner.pid).pet()
        assert (theirs / WATCHDOG_FILE).stat().st_mtime == 0
    finally:
        shutil.rmtree(theirs)


# -- what one user's refused watchdogs write to the agent's log ------------------------------

WARN_LINES = 5  # docs/hooks.md: refusal warnings of one user per minute, then a line counting


def test_one_users_refused_watchdogs_never_flood_the_log(alive_spools, alive_agent, attacker):
    """A writes 300 watchdogs (ids of its choosing) naming PID 1, root's: each is refused
    when its second runs out. The refusals are counted, and warned about as any refusal
    of one user's is: a few lines, then one that counts the rest."""
    init = owner_of(1)
    ids = [entry_id(2000 + n) for n in range(300)]
    body = json.dumps(dog(init, timeout=1.0))
    script = _ADD_MANY.replace('"lease.json"', '"watchdog.json"')
    argv = [SYSTEM_PYTHON, "-I", "-S", "-c", script, str(REPO), str(alive_spools.watchdogs)]
    subprocess.run(setpriv_argv(attacker, *argv, body, *ids), check=True, cwd="/")
    wait_for(lambda: alive_agent.status()["watchdogs"]["refused"] == 300, DEADLINE, "300 refusals")
    lines = [x for x in alive_agent.text().splitlines() if "refused: its owner" in x]
    assert len(lines) <= WARN_LINES, f"{len(lines)} lines of refusals"


def test_one_users_failing_leases_never_flood_the_log(alive_spools, alive_agent, procs, attacker):
    """A writes 300 leases that fail (`false`, every 1 s): each failure is counted, and
    warned about within the same bound per user as a refusal."""
    _, owner = sleeper_as(procs, attacker)
    ids = [entry_id(3000 + n) for n in range(300)]
    body = json.dumps(lease(owner, ["false"], every=60.0))
    argv = [SYSTEM_PYTHON, "-I", "-S", "-c", _ADD_MANY, str(REPO), str(alive_spools.leases)]
    subprocess.run(setpriv_argv(attacker, *argv, body, *ids), check=True, cwd="/")
    wait_for(lambda: alive_agent.status()["leases"]["failures"] >= 300, DEADLINE, "300 failures")
    lines = [x for x in alive_agent.text().splitlines() if "failed: exited with code 1" in x]
    assert len(lines) <= WARN_LINES, f"{len(lines)} lines of failures"


_CANCEL = """
import sys
sys.path.insert(0, sys.argv[1])
from exitwatch.alive import find_watchdog
print(find_watchdog(int(sys.argv[2])).cancel())
"""


def test_another_user_taking_the_name_a_watchdog_is_written_under_changes_nothing(
    alive_spools, procs, attacker, other_user
):
    """B makes `.ID` in the spool for A's watchdog ID (the name add_entry wrote it under
    before renaming it into place): A still arms it."""
    _, owner = sleeper_as(procs, attacker)
    squat = alive_spools.watchdogs / f".{watchdog_id(owner, attacker.pw_uid)}"
    subprocess.run(setpriv_argv(other_user, "mkdir", "-m", "700", str(squat)), check=True)
    argv = [SYSTEM_PYTHON, "-I", "-S", "-c", _ARM, str(REPO), str(owner.pid)]
    done = subprocess.run(setpriv_argv(attacker, *argv), capture_output=True, text=True, cwd="/")
    assert done.returncode == 0, done.stderr[-400:]


def test_another_user_cannot_keep_a_user_from_cancelling_a_watchdog(
    alive_spools, procs, attacker, other_user
):
    """B makes `.ID.cancelled` in the spool for A's watchdog ID (a hash anyone can compute):
    A arms it, then must still be able to cancel it (`exitwatch run` cancels its own when
    CMD ends, and arming again cancels first)."""
    dogs = alive_spools.watchdogs
    _, owner = sleeper_as(procs, attacker)
    squat = dogs / f".{watchdog_id(owner, attacker.pw_uid)}.cancelled"
    subprocess.run(setpriv_argv(other_user, "mkdir", "-m", "700", str(squat)), check=True)
    for script, expected in ((_ARM, None), (_CANCEL, "True")):
        argv = [SYSTEM_PYTHON, "-I", "-S", "-c", script, str(REPO), str(owner.pid)]
        done = subprocess.run(
            setpriv_argv(attacker, *argv), capture_output=True, text=True, cwd="/"
        )
        assert done.returncode == 0, done.stderr[-400:]
        assert expected is None or done.stdout.strip() == expected


def test_a_reload_is_no_pet(alive_spools, alive_agent, procs, attacker):
    """A's watchdog (10 s) goes unpetted; the agent is reloaded (SIGHUP) halfway: the owner
    is ended at about 10 s, not 10 s after the reload."""
    agent = alive_agent
    victim, owner = sleeper_as(procs, attacker)
    wid = watchdog_id(owner, attacker.pw_uid)
    add_as(attacker, alive_spools.watchdogs, wid, WATCHDOG_FILE, dog(owner, timeout=10.0))
    wait_for(lambda: agent.status()["watchdogs"]["armed"] == 1, DEADLINE, "it armed")
    armed = time.monotonic()
    wait_for(lambda: time.monotonic() - armed >= 5, 10, "halfway")
    agent.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: "config reloaded" in agent.text(), DEADLINE, "the reload")
    wait_for(lambda: gone(victim), DEADLINE, "the watchdog to fire")
    assert time.monotonic() - armed < 10 + 2.5, agent.text()


# -- nothing run for a user gets more than that user's rights --------------------------------

_RIGHTS = (
    'grep -E "^(Uid|Gid|Groups|CapInh|CapPrm|CapEff|CapAmb):" /proc/self/status > "$1.tmp"; '
    'ls /proc/self/fd >> "$1.tmp"; mv "$1.tmp" "$1"'
)


def test_a_lease_runs_with_its_users_rights_and_nothing_more(
    alive_spools, alive_agent, procs, attacker, out
):
    """A lease's run as A: A's uids and gids, A's groups alone, no capability in its
    permitted, effective, inheritable or ambient sets, and none of the agent's descriptors
    (a spool's, another owner's pidfd) beyond stdin, stdout and stderr."""
    _, owner = sleeper_as(procs, attacker)
    seen = out / "rights"
    body = lease(owner, ["sh", "-c", _RIGHTS, "rights", str(seen)], every=60.0)
    add_as(attacker, alive_spools.leases, entry_id(5), LEASE_FILE, body)
    wait_for(seen.exists, DEADLINE, "the lease to run")
    lines = seen.read_text().splitlines()
    fields = {k: v.split() for k, _, v in (line.partition(":") for line in lines if ":" in line)}
    uid, gid = str(attacker.pw_uid), str(attacker.pw_gid)
    assert fields["Uid"] == [uid] * 4 and fields["Gid"] == [gid] * 4, fields
    groups = sorted(str(g) for g in os.getgrouplist(attacker.pw_name, attacker.pw_gid))
    assert sorted(fields["Groups"]) == groups, fields
    for cap in ("CapInh", "CapPrm", "CapEff", "CapAmb"):
        assert int(fields[cap][0], 16) == 0, fields
    fds = sorted(int(x) for x in lines if x.isdigit())
    assert fds[:3] == [0, 1, 2] and len(fds) == 4, fds  # the fourth: ls's own /proc/self/fd
