"""Write one of exitwatch's man pages to stdout:

  exitwatch.8       every command and option, from the click CLI's own help (here);
  exitwatch.toml.5  every setting, from the Config dataclass (mantoml.py);
  exitwatch-run.1   `exitwatch run`, from its click help (manrun.py);
  exitwatch-adopt.8 `exitwatch adopt`, from its click help (manadopt.py);
  exitwatch-files.5 the marker, hook, audit log and status formats (manfiles.py).

Run at package build time (debian/rules), so each page says what the code it ships with
does; only the prose around the generated parts lives in these files, and mansource.py
reads the code.
Usage: PYTHONPATH=. python3 packaging/manpage.py exitwatch.8 > exitwatch.8
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from manadopt import exitwatch_adopt_8
from manfiles import exitwatch_files_5
from manrun import exitwatch_run_1
from mansource import (
    commands,
    esc,
    header,
    options,
    paragraphs,
    root,
    summary,
)
from mantoml import exitwatch_toml_5

from exitwatch.cli import cli
from exitwatch.service.config import DEFAULT_PATH

DESCRIPTION = r"""
Evaluation runners create Docker containers and scratch workdirs, and remove them when they
exit. A runner that is SIGKILLed or OOM-killed runs no cleanup, and those resources leak.
.PP
.B exitwatch agent
runs as a system service. It follows process exits, confirms that an owner is dead
against /proc, and then removes that owner's containers (with their compose project) and
workdirs, usually within a second. A live owner's resources are never touched.
.PP
An owner is one process, written
.IR machine_id : boot_id : pid : starttime ,
where machine_id is /etc/machine-id and starttime is field 22 of /proc/\fIpid\fR/stat; a
reused pid is not the same owner, and another machine's owner (a shared engine or
filesystem) is never judged here: what it holds is left alone.
A runner labels its containers
.B exitwatch.owner=\fIowner\fR
(see
.BR "exitwatch labels" )
and marks a workdir with a file
.B .exitwatch\-owner
holding {"owner": "\fIowner\fR"} (see
.BR "exitwatch mark" ).
A container labelled
.B exitwatch.keep=true
is left alone.
.PP
For what it cannot remove itself (a remote sandbox, a tunnel), a runner leaves a command
with
.BR "exitwatch on\-death" :
once the owner is dead, the agent runs it as the user who registered it, and deletes the
hook once it exits 0. For while it lives, it leaves a command to run as that user every
so often
.RB ( "exitwatch while\-alive" ,
a lease: a sandbox's keepalive, run until the owner dies, killed the moment it does), or a
watchdog
.RB ( "exitwatch watchdog" ):
once the owner goes unpetted for its timeout, the agent ends it (SIGTERM, then SIGKILL
after a grace), and it is then a dead owner like any other. A runner that labels nothing
can be run under
.BR exitwatch\-run (1),
whose
.B \-\-max\-time
and
.B \-\-idle\-timeout
arm such a watchdog on the run.
.PP
.B exitwatch adopt
serves one labelling Docker socket for the whole host, for runners that cannot be started
under exitwatch\-run: mounted into a runner's container in place of /var/run/docker.sock,
or named by DOCKER_HOST. The kernel names each client's process (SO_PEERCRED), even inside
a container; what it creates is labelled with its owner: the nearest process whose command
line a rule matches; else, in a runner container (labelled exitwatch.adopt=owner, or named
in [adopt] containers), the container's init (the container's life); else nobody, and it
passes unlabelled.
"""

FILES = [
    (
        DEFAULT_PATH,
        "Agent settings (TOML), see exitwatch.toml(5); options on the command line win.",
    ),
    ("/var/lib/exitwatch/", "State directory: the audit log of removals and refusals."),
    ("/run/exitwatch/", "Runtime directory: the status socket."),
    ("/var/spool/exitwatch/hooks/", "On-death hooks (mode 1733: anyone adds, only root lists)."),
    ("/var/spool/exitwatch/leases/", "Leases, as the hooks' spool (made by the agent)."),
    ("/var/spool/exitwatch/watchdogs/", "Watchdogs, as the hooks' spool (made by the agent)."),
    ("/lib/systemd/system/exitwatch.service", "The hardened systemd unit."),
    (
        "/lib/systemd/system/exitwatch-adopt.socket",
        "The socket of exitwatch adopt, /run/exitwatch/docker.sock, held by systemd across "
        "restarts of exitwatch-adopt.service; both disabled until enabled.",
    ),
]

EXIT_STATUS = r"""
.TP
.B 0
Done; for
.BR "exitwatch agent" " and " "exitwatch adopt" ,
stopped by SIGTERM or SIGINT.
.TP
.B 1
An error, in one line on stderr,
.RB \(lq "Error: " ...\(rq,
that says what is wrong and what to do: a bad setting, not root, no Docker engine
answering, no agent's spool (hooks, leases, watchdogs), no watchdog of yours to pet, a
removal that failed, and so on.
.TP
.B 2
Bad use: an unknown command or option, a missing or bad argument.
.TP
.B 3
.B exitwatch status
only: no agent answered; what is shown is a one\-shot scan's.
.PP
.B exitwatch run
exits with its command's status: see
.BR exitwatch\-run (1).
"""

ENVIRONMENT = r"""
.TP
.B DOCKER_HOST
The engine that
.BR "exitwatch agent" ", " reap " and " status
speak to when
.B [containers] docker_host
is unset, and the one
.B exitwatch adopt
forwards to when neither of its settings names one; only a local unix:// socket is taken.
Unset: /var/run/docker.sock. The packaged units unset it (UnsetEnvironment=): an agent or
adopt started by systemd takes only its settings.
.TP
.B EXITWATCH_HOOK_DIR
The spool
.B exitwatch on\-death
writes to (default /var/spool/exitwatch/hooks); it must be the agent's
.BR "[hooks] dir" .
.TP
.B EXITWATCH_LEASE_DIR
The spool
.B exitwatch while\-alive
writes to (default /var/spool/exitwatch/leases); it must be the agent's
.BR "[leases] dir" .
.TP
.B EXITWATCH_WATCHDOG_DIR
The spool
.B exitwatch watchdog
and
.BR "exitwatch run \-\-max\-time" / \-\-idle\-timeout
write to (default /var/spool/exitwatch/watchdogs); it must be the agent's
.BR "[watchdogs] dir" .
.TP
.BR EXITWATCH_OWNER ", " EXITWATCH_RUN
Set by
.B exitwatch run
for its command; a process that carries both, naming one owner, is that run's, and the
agent kills it once the owner is dead (the
.B [processes]
kind).
.B exitwatch labels \-\-format env
prints the first, for compose files.
.TP
.BR EXITWATCH_DEAD_OWNER ", " EXITWATCH_DEATH
Given to an on\-death hook's command: the dead owner, and how it died (e.g.
.IR "killed by SIGKILL (process gone)" ).
.TP
.B EXITWATCH_LEASE_OWNER
Given to each run of a lease's command: the owner it keeps something alive for.
.TP
.B EXITWATCH_NETLINK_RCVBUF
The receive buffer of the netlink source, in bytes (default 16777216).
.TP
.BR NOTIFY_SOCKET ", " WATCHDOG_USEC
Set by systemd: the agent sends READY=1, RELOADING=1, STOPPING=1 and WATCHDOG=1
(sd_notify(3)).
.TP
.BR LISTEN_PID ", " LISTEN_FDS
Set by systemd (exitwatch\-adopt.socket): the one socket
.B exitwatch adopt
serves (sd_listen_fds(3)).
"""

EXAMPLES = r"""
A runner's shell labels a container and marks a workdir; the shell is their owner:
.PP
.EX
docker run \-d $(exitwatch labels \-\-format docker\-args) IMAGE sleep infinity
exitwatch mark "$WORKDIR"
.EE
.PP
A compose project whose services carry
.B exitwatch.owner: \(dq${EXITWATCH_OWNER}\(dq
in their labels:
.PP
.EX
eval "$(exitwatch labels \-\-format env)"
docker compose up \-d
.EE
.PP
A remote sandbox deleted once the shell dies, however it dies; a clean exit cancels it:
.PP
.EX
id=$(exitwatch on\-death \-\-timeout 30 \-\- \e
     curl \-fsS \-X DELETE https://api.example/sandboxes/42)
trap \(aqexitwatch on\-death \-\-cancel "$id"\(aq EXIT
.EE
.PP
A sandbox kept alive for as long as the shell lives, and the shell ended once ten minutes
pass without progress:
.PP
.EX
exitwatch while\-alive \-\-every 60 \-\- \e
     curl \-fsS \-X POST https://api.example/sandboxes/42/keepalive
exitwatch watchdog \-\-timeout 600
for t in tasks/*; do run_task "$t"; exitwatch watchdog \-\-pet; done
exitwatch watchdog \-\-cancel
.EE
.PP
An operator: what would go now, what went in the last 12 hours, a new config file read:
.PP
.EX
exitwatch reap \-\-dry\-run
exitwatch status \-\-since 12h
systemctl reload exitwatch
.EE
"""

SEE_ALSO = (
    "exitwatch.toml(5), exitwatch\\-files(5), exitwatch\\-run(1), exitwatch\\-adopt(8), "
    "systemctl(1), journalctl(1), docker(1), docker\\-compose(1), systemd.exec(5)"
)


def exitwatch_8() -> str:
    top = root()
    out = [
        header("exitwatch", 8, "System Administration"),
        ".SH NAME",
        f"exitwatch \\- {summary(cli)}",
        ".SH SYNOPSIS",
        ".B exitwatch",
        esc(" ".join(cli.collect_usage_pieces(top))),
        ".SH DESCRIPTION",
        DESCRIPTION.strip(),
        ".SH OPTIONS",
        *options(cli, top),
        ".SH COMMANDS",
    ]
    for cmd, ctx in commands(cli, top):
        out += [
            f'.SS "{esc(ctx.command_path)} {esc(" ".join(cmd.collect_usage_pieces(ctx)))}"',
            *paragraphs(cmd.help or cmd.short_help or ""),
            *options(cmd, ctx),
        ]
    out += [".SH EXIT STATUS", EXIT_STATUS.strip(), ".SH ENVIRONMENT", ENVIRONMENT.strip()]
    out.append(".SH FILES")
    for path, what in FILES:
        out += [".TP", f".I {esc(path)}", esc(what)]
    out += [".SH EXAMPLES", EXAMPLES.strip(), ".SH SEE ALSO", SEE_ALSO]
    return "\n".join(out) + "\n"


PAGES: dict[str, Callable[[], str]] = {
    "exitwatch.8": exitwatch_8,
    "exitwatch.toml.5": exitwatch_toml_5,
    "exitwatch-run.1": exitwatch_run_1,
    "exitwatch-adopt.8": exitwatch_adopt_8,
    "exitwatch-files.5": exitwatch_files_5,
}


def render(page: str) -> str:
    return PAGES[page]()


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in PAGES:
        print(f"usage: manpage.py PAGE, one of {', '.join(PAGES)}", file=sys.stderr)
        sys.exit(2)
    sys.stdout.write(render(sys.argv[1]))
