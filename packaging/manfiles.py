"""exitwatch-files(5): the formats of the files a runner and the agent write for each other
and for people: the workdir marker, the on-death hook, the lease, the watchdog, the audit
log and the status document. Their constants come from the code; the prose says what
docs/contract.md, docs/hooks.md and docs/operations.md say, for a host that has only the
package."""

from __future__ import annotations

from dataclasses import fields

from mansource import esc, header

from exitwatch.agent.record import Reap
from exitwatch.alive import (
    LEASE_DIR,
    LEASE_FILE,
    LEASE_MAX_EVERY,
    LEASE_MIN_EVERY,
    REASON_MAX,
    WATCHDOG_DIR,
    WATCHDOG_FILE,
    WATCHDOG_GRACE,
    WATCHDOG_MAX_GRACE,
    WATCHDOG_MAX_TIMEOUT,
    WATCHDOG_MIN_TIMEOUT,
)
from exitwatch.contract import (
    HOOK_DIR,
    HOOK_FILE,
    HOOK_MAX_BYTES,
    HOOK_MAX_TIMEOUT,
    JSON_MAX_DEPTH,
    MARKER,
    MARKER_MAX_BYTES,
)
from exitwatch.service.config import Config
from exitwatch.service.status.build import SCHEMA

# The keys of a hook file, each with what it holds (contract.hook_problem checks them).
HOOK_KEYS = {
    "owner": "the owner, a string (see OWNERS)",
    "argv": "the command and its arguments: a non\\-empty array of strings, the first not "
    "empty, none with a NUL",
    "cwd": 'the directory to run in: an absolute path, or "" for HOME',
    "env": 'what to add to the environment: an object of NAME: "value" strings',
    "timeout": f"seconds before the command is killed: a number in (0, {HOOK_MAX_TIMEOUT:g}]",
    "created": "when it was registered: unix time, a number",
}

# A lease file's keys beyond a hook file's (alive.lease_problem checks them).
LEASE_KEYS = {
    "every": f"seconds between two runs: a number in [{LEASE_MIN_EVERY:g}, {LEASE_MAX_EVERY:g}]",
}

# The keys of a watchdog file (alive.watchdog_problem checks them).
WATCHDOG_KEYS = {
    "owner": "the owner, a string (see OWNERS): the process the watchdog ends",
    "timeout": "seconds without a pet before it is ended: a number in "
    f"[{WATCHDOG_MIN_TIMEOUT:g}, {WATCHDOG_MAX_TIMEOUT:.0f}] "
    f"({WATCHDOG_MAX_TIMEOUT / 86400:g} days)",
    "grace": "seconds between SIGTERM and SIGKILL: a number in "
    f"[0, {WATCHDOG_MAX_GRACE:g}] ({WATCHDOG_GRACE:g} unless the runner says)",
    "created": "when it was armed: unix time, a number",
    "reason": f"optional: what it is for, at most {REASON_MAX} characters, quoted in the "
    "agent's lines",
}

# What each field of an audit line (and of a "reaps" item of the status document) holds.
REAP_FIELDS = {
    "time": "unix time of the removal or refusal",
    "what": 'what it was about, for people: "container ID (NAME)", "workdir PATH", ...',
    "kind": "container, network, volume, workdir, hook, lease, watchdog or process",
    "owner": "its owner",
    "death": 'how the owner died: "killed by SIGKILL (process gone)", "boot id differs '
    '(host rebooted)", ...',
    "latency_ms": "milliseconds from the owner's death being noticed to this line",
    "result": 'what happened: "removed", "already gone", or why not',
    "ok": "true when it is gone",
    "refused": "true when a safety check left it alone",
    "dry_run": "true when nothing was removed (--dry-run)",
}

STATUS_KEYS = {
    "schema": f"{SCHEMA}",
    "agent": "version, pid, started_at (unix time), uptime_s, source, source_reason, "
    "dry_run, config (every setting); null when no agent answers",
    "docker": "endpoint, connected, reconnects, last_error",
    "workdirs": "discovery: how workdirs are followed (inotify, or rescans and why); "
    "running agent only",
    "processes": "the leftover\\-process rescans: interval_s, rescans, failures, failing "
    "(failures in a row now), last_error; absent with [processes] enabled = false",
    "leases": "leases (followed now), running, runs, failures, failing (leases whose last "
    "run failed), last_failure, unreadable (runs not made: whether the owner lives could "
    "not be read); absent with [leases] enabled = false",
    "watchdogs": "armed, fired (owners ended), killed (of which with SIGKILL), refused, "
    "unreadable (looks that could not be made), last_unreadable, recent (the last owners "
    "ended: time, owner, watchdog, after_s, killed); absent with [watchdogs] enabled = "
    "false",
    "machine": "this machine's id, whose owners the agent judges; null when it has none",
    "owners": "live owners of this machine, each with owner, pid, name (what the owner is, such as "
    '"container NAME" for one exitwatch adopt found, or null), containers (id, name, '
    "project), workdirs, hooks (ID: COMMAND), leases (ID: every S s: COMMAND), watchdogs "
    "(ID: T s) and processes",
    "elsewhere": "other machines' owners, whose resources are left alone, alive or dead: "
    "the keys of owners, with machine (its machine id) and why",
    "pending": "dead owners' resources not yet removed: owner, death, what; for a running "
    "agent also kind, attempt (of reap_attempts), state (removing, waiting for a slot, "
    "waiting to retry, or given up until the resource goes) and retry_in_s",
    "busy": "why owners and pending are empty: the agent's loop did not answer within a "
    "second; running agent only",
    "reaps": "recent removals and refusals, each with the fields of an audit line",
    "counters": "exits_seen, exit_hints, events_lost, resyncs, removal_errors, refusals, "
    "gave_up, hook_runs, hook_failures, hook_timeouts, reconciles, reconcile_missed, "
    "reconcile_errors, reaped_KIND",
    "reconcile": "interval_s, running, next_in_s, last (at, run, and for a periodic one "
    "took_s, listed, missed, orphaned, errors); running agent only",
    "skipped_markers": "how many unreadable markers the scan skipped; no agent only",
    "not_listed": "what the scan could not list, one line each; no agent only",
}


def _tagged(items: dict[str, str]) -> list[str]:
    out = []
    for key, what in items.items():
        out += [".TP", f".B {esc(key)}", what]
    return out


DESCRIPTION = r"""
A runner and the agent,
.BR exitwatch (8),
speak through a few small files: a marker names a workdir's owner, a hook file a command to
run once its owner is dead, a lease file a command to run while it lives, a watchdog file
how long it may go without a pet. The agent writes what it did to an audit log, and answers
.B exitwatch status
with one JSON document. This page gives their formats.
"""

OWNER = r"""
Every file names its owner, one process, the same way:
.PP
.EX
\fImachine_id\fR:\fIboot_id\fR:\fIpid\fR:\fIstarttime\fR
.EE
.PP
.I machine_id
is /etc/machine-id, else /var/lib/dbus/machine-id (32 lowercase hex digits; see
.BR machine\-id (5)),
.I boot_id
is /proc/sys/kernel/random/boot_id (a lowercase UUID),
.I pid
the process's pid as the host sees it, and
.I starttime
field 22 of /proc/\fIpid\fR/stat, its start in clock ticks since boot: a reused pid is not
the same owner, and a reboot makes every earlier owner of the machine dead. At most 128
characters. Where neither file holds a machine id, and in what was written before
exitwatch wrote one, an owner is
.IR boot_id : pid : starttime ,
which says no machine.
.B exitwatch labels
prints one (so does exitwatch.owner_labels() in Python); inside a container, whose pids are
not the host's, no owner can be named (see
.BR exitwatch\-adopt (8)).
An agent judges only its own machine's owners: those of the current boot, those that name
its machine id, and those that name none. Another machine's (of another boot and another
machine id: a runner on another host sharing the engine or a filesystem) is never taken
for dead, and what it holds is left alone; status lists it under
.BR elsewhere .
An owner is alive while its boot id is the current one, /proc/\fIpid\fR/stat exists with
the same start time, and it is not a zombie; a malformed owner is never taken for dead.
"""

MARKER_TEXT = rf"""
A workdir is a directory holding a file
.B {esc(MARKER)}
directly inside it, written by
.B exitwatch mark
or exitwatch.mark_workdir(): a JSON object with a string
.BR owner ,
at most {MARKER_MAX_BYTES} bytes of UTF\-8, nesting at most {JSON_MAX_DEPTH} deep; other
keys are ignored.
.PP
.EX
{{"owner": "3d1219c7c4c5404aaa1f6d2a48adfda4:b71a6edf\-22f3\-4290\-8340\-bce5f7fd0491:2081:538187"}}
.EE
.PP
Workdirs are looked for under
.B roots
of the
.B [workdirs]
table (default /tmp and /var/tmp), at most its
.B depth
levels down
.RB ( exitwatch.toml (5)).
One goes once its owner is dead, and only if the marker and the directory belong to the
same user (or the marker to root), the marker has a single link, and the directory is not
a root itself; removal never follows a symlink nor crosses a mount point. Such a marker
claims everything below its directory. Inside it, a nested workdir of a live other owner
stays, with the outer marker, and the removal is refused until that owner is dead too. A
malformed marker is skipped with a warning.
"""

HOOK_TEXT = rf"""
A hook is a directory
.IR SPOOL / ID /
holding one file,
.BR {esc(HOOK_FILE)} .
The spool is {esc(HOOK_DIR)} (the agent's
.BR "[hooks] dir" ;
EXITWATCH_HOOK_DIR for
.BR "exitwatch on\-death" ),
root's, mode 1733: anyone adds, only root lists.
.I ID
is 32 lowercase hex digits. The directory is its writer's, mode 0700, and the file its
writer's too, mode 0600, at most {HOOK_MAX_BYTES} bytes: a JSON object with exactly these
keys:
"""

HOOK_AFTER = r"""
.PP
.EX
{"owner": "3d1219c7c4c5404aaa1f6d2a48adfda4:b71a6edf\-22f3\-4290\-8340\-bce5f7fd0491:2081:538187",
 "argv": ["curl", "\-fsS", "\-X", "DELETE", "https://api.example/sandboxes/42"],
 "cwd": "/home/ann", "env": {}, "timeout": 60.0, "created": 1764550000.0}
.EE
.PP
.B exitwatch on\-death
writes it under a dot name and renames the directory into place whole; a name starting
with a dot is never read. Once the owner is dead, the agent runs argv as the user who owns
the directory (and the file), in cwd, with PATH, HOME, USER, LANG, then env, then
EXITWATCH_DEAD_OWNER and EXITWATCH_DEATH; it removes the hook once the command exits 0, and
otherwise tries it again like any failed removal
.RB ( reap_attempts ).
An entry that is a symlink, has another owner's file, or is writable by others, is refused
with a warning and never run.
"""


def _spool_entry(noun: str, file: str, spool: str, env: str, command: str) -> str:
    """The start of a section on a spool beside the hooks': where its entries are."""
    return rf"""
A {noun} is a directory
.IR SPOOL / ID /
holding one file,
.BR {esc(file)} ,
in a spool of its own, {esc(spool)} (the agent's
.BR "[{noun}s] dir" ;
{env} for
.BR "{esc(command)}" ),
with the rules of the hook spool"""


LEASE_TEXT = _spool_entry(
    "lease", LEASE_FILE, LEASE_DIR, "EXITWATCH_LEASE_DIR", "exitwatch while-alive"
) + (
    ": the same modes, owners and bounds, and the keys of a hook\n"
    "file (its timeout bounds each run), with one more:"
)

LEASE_AFTER = r"""
.PP
.EX
{"owner": "3d1219c7c4c5404aaa1f6d2a48adfda4:b71a6edf\-22f3\-4290\-8340\-bce5f7fd0491:2081:538187",
 "argv": ["curl", "\-fsS", "\-X", "POST", "https://api.example/sandboxes/42/keepalive"],
 "cwd": "/home/ann", "env": {}, "every": 60.0, "timeout": 20.0, "created": 1764550000.0}
.EE
.PP
While the owner lives, the agent runs argv as a hook's, with EXITWATCH_LEASE_OWNER (the
owner) in place of EXITWATCH_DEAD_OWNER and EXITWATCH_DEATH: first when it sees the lease,
then at intervals of
.B every
seconds, never twice at once, at most 8 runs of one user at a time. A run under way when
the owner exits is killed with its process group; once the owner is dead, the lease is
deleted. A failed run is logged and counted, and not retried before its next interval.
"""

WATCHDOG_TEXT = (
    _spool_entry(
        "watchdog", WATCHDOG_FILE, WATCHDOG_DIR, "EXITWATCH_WATCHDOG_DIR", "exitwatch watchdog"
    )
    + r""".
.I ID
is the first 32 hex digits of the SHA\-256 of
.IR UID : OWNER ,
so that its user finds it from the process alone. The file is a JSON object with these
keys:
"""
)

WATCHDOG_AFTER = r"""
.PP
.EX
{"owner": "3d1219c7c4c5404aaa1f6d2a48adfda4:b71a6edf\-22f3\-4290\-8340\-bce5f7fd0491:2081:538187",
 "timeout": 600.0, "grace": 10.0, "created": 1764550000.0, "reason": "eval loop"}
.EE
.PP
A pet is a touch of the file
.RB ( "exitwatch watchdog \-\-pet" ,
utime(2)): the agent reads its change time (st_ctime), which the kernel sets. The first
time the agent sees a watchdog counts as a pet. Once
.B timeout
seconds pass without one, the agent sends the owner SIGTERM and SIGCONT through a pidfd,
then SIGKILL after
.B grace
seconds if it still runs; only if every uid of the process (real, effective, saved, file
system) is the uid that owns the directory, or root does. Arming it again replaces the
entry, directory and file, and counts as a pet. The firing is one audit line. Once the
owner is dead, the watchdog is deleted.
"""

AUDIT_TEXT = r"""
One JSON object a line, appended for every removal and every refusal by the agent and by
.BR "exitwatch reap" ,
mode 0600, rotated when it passes
.B audit_max_bytes
(one older file,
.IR .1 ,
is kept). Its fields:
"""

AUDIT_AFTER = r"""
.TP
.B extra
present where the kind has more to say: a hook's run adds
.B hook
(argv0, uid, returncode (negative: killed by that signal), timed_out, seconds,
output_tail); a workdir left in place adds
.B left
(what stayed, and why); a network or volume adds its
.BR id ;
a watchdog that ended its owner (kind watchdog, what
.RI \(lqowner\ pid\  PID \(rq)
adds
.B watchdog
(id, uid, timeout, grace).
.PP
.B exitwatch status \-\-since
reads it back.
"""

STATUS_TEXT = r"""
.B exitwatch status \-\-json
prints one JSON object: the running agent's answer on its status socket, or, with no agent
(exit status 3), a one\-shot scan's. Its keys:
"""


def exitwatch_files_5() -> str:
    out = [
        header("exitwatch-files", 5, "File Formats"),
        ".SH NAME",
        "exitwatch\\-files \\- the workdir marker, the on\\-death hook, the lease, the "
        "watchdog, the audit log and the status document of exitwatch",
        ".SH SYNOPSIS",
        f".IR WORKDIR /{esc(MARKER)}",
        ".br",
        f".IR {esc(HOOK_DIR)}/ ID /{esc(HOOK_FILE)}",
        ".br",
        f".IR {esc(LEASE_DIR)}/ ID /{esc(LEASE_FILE)}",
        ".br",
        f".IR {esc(WATCHDOG_DIR)}/ ID /{esc(WATCHDOG_FILE)}",
        ".br",
        f".I {esc(Config.audit_log)}",
        ".br",
        ".B exitwatch status \\-\\-json",
        ".SH DESCRIPTION",
        DESCRIPTION.strip(),
        ".SH OWNERS",
        OWNER.strip(),
        ".SH WORKDIR MARKER",
        MARKER_TEXT.strip(),
        ".SH ON-DEATH HOOK",
        HOOK_TEXT.strip(),
        *_tagged(HOOK_KEYS),
        HOOK_AFTER.strip(),
        ".SH LEASE",
        LEASE_TEXT.strip(),
        *_tagged(LEASE_KEYS),
        LEASE_AFTER.strip(),
        ".SH WATCHDOG",
        WATCHDOG_TEXT.strip(),
        *_tagged(WATCHDOG_KEYS),
        WATCHDOG_AFTER.strip(),
        ".SH AUDIT LOG",
        AUDIT_TEXT.strip(),
        *_tagged({f.name: REAP_FIELDS[f.name] for f in fields(Reap)}),
        AUDIT_AFTER.strip(),
        ".SH STATUS DOCUMENT",
        STATUS_TEXT.strip(),
        *_tagged(STATUS_KEYS),
        ".SH SEE ALSO",
        "exitwatch(8), exitwatch.toml(5), exitwatch\\-run(1), exitwatch\\-adopt(8)",
    ]
    return "\n".join(out) + "\n"
