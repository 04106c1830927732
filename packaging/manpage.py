"""Write one of exitwatch's man pages to stdout:

  exitwatch.8       every command and option, from the click CLI's own help;
  exitwatch.toml.5  every setting, from the Config dataclass (packaging/mansource.py);
  exitwatch-run.1   `exitwatch run`, from its click help.

Run at package build time (debian/rules), so each page says what the code it ships with
does; only the prose around the generated parts lives here.
Usage: PYTHONPATH=. python3 packaging/manpage.py exitwatch.8 > exitwatch.8
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import fields

import click
from mansource import (
    commands,
    esc,
    field_docs,
    flags,
    header,
    options,
    paragraphs,
    prose,
    root,
    summary,
    takes,
    toml,
)

from exitwatch.cli import cli
from exitwatch.service.config import DEFAULT_PATH, TABLE, Adopt, Config

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
.IR boot_id : pid : starttime ,
where starttime is field 22 of /proc/\fIpid\fR/stat; a reused pid is not the same owner.
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
hook once it exits 0. A runner that labels nothing can be run under
.BR exitwatch\-run (1).
.PP
.B exitwatch adopt
serves one labelling Docker socket for the whole host, for runners that cannot be started
under exitwatch\-run: mounted into a runner's container in place of /var/run/docker.sock,
or named by DOCKER_HOST. The kernel names each client's process (SO_PEERCRED), even inside
a container; what it creates is labelled with its owner: in a container, the nearest
process whose command line a rule matches, else the container's init (the container's
life); on the host, the nearest such process, else nobody, and it passes unlabelled.
"""

FILES = [
    (
        DEFAULT_PATH,
        "Agent settings (TOML), see exitwatch.toml(5); options on the command line win.",
    ),
    ("/var/lib/exitwatch/", "State directory: the audit log of removals and refusals."),
    ("/run/exitwatch/", "Runtime directory: the status socket."),
    ("/var/spool/exitwatch/hooks/", "On-death hooks (mode 1733: anyone adds, only root lists)."),
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
answering, no agent's hook spool, a removal that failed, and so on.
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
.B docker_host
is unset, and the one
.B exitwatch adopt
forwards to when neither of its settings names one; only a local unix:// socket is taken.
Unset: /var/run/docker.sock.
.TP
.B EXITWATCH_HOOK_DIR
The spool
.B exitwatch on\-death
writes to (default /var/spool/exitwatch/hooks); it must be the agent's
.BR hook_dir .
.TP
.BR EXITWATCH_OWNER ", " EXITWATCH_RUN
Set by
.B exitwatch run
for its command; a process that carries both, naming one owner, is that run's, and the
agent kills it once the owner is dead
.RB ( kill_leftovers ).
.B exitwatch labels \-\-format env
prints the first, for compose files.
.TP
.BR EXITWATCH_DEAD_OWNER ", " EXITWATCH_DEATH
Given to an on\-death hook's command: the dead owner, and how it died (e.g.
.IR "killed by SIGKILL (process gone)" ).
.TP
.B EXITWATCH_NETLINK_RCVBUF
The receive buffer of the netlink source, in bytes (default 16777216).
.TP
.BR NOTIFY_SOCKET ", " WATCHDOG_USEC
Set by systemd: the agent sends READY=1, STOPPING=1 and WATCHDOG=1 (sd_notify(3)).
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


# -- exitwatch.toml(5) --------------------------------------------------------------------

CONFIG_DESCRIPTION = rf"""
The settings of
.BR "exitwatch agent" ,
read from
.I {esc(DEFAULT_PATH)}
when it exists, or from the file
.B \-\-config
names.
.B exitwatch reap
and
.B exitwatch status
read the same file, and
.B exitwatch adopt
its
.B [adopt]
table. It is TOML. Every key is optional: a key left out keeps its default,
and the Debian package installs the file with every key commented out at its default. A
key given as an option on the command line wins over the file.
.PP
The agent reads the file at start, and again on SIGHUP
.RB ( "systemctl reload exitwatch" );
a file that is bad on a reload is logged and the running settings stay. At start, an
unknown key, a wrong type or a bad value stops the agent with one line naming the file, the
key and what is expected, such as
.PP
.EX
Error: {esc(DEFAULT_PATH)}: poll_interval: expected a number, got 'fast'
.EE
.PP
A key that is unset by default takes a string; leave it out to keep it unset.
"""

CONFIG_EXAMPLE = """\
source = "netlink"
workdir_roots = ["/tmp", "/var/tmp", "/scratch"]
metrics_addr = "127.0.0.1:9788"
reconcile_interval = 300

[adopt]
rules = ["*/inspect eval *", "bench eval *"]
"""

CONFIG_NOTES = r"""
Under exitwatch.service the agent may write only under /tmp and /var/tmp: a workdir root
elsewhere, such as /scratch above, also needs
.B ReadWritePaths=
in a drop\-in
.RB ( "systemctl edit exitwatch" ).
"""


def _settings(of: type, docs: dict[str, str], table: bool) -> list[str]:
    out = []
    for field in fields(of):
        if not table and field.name == TABLE:
            continue  # a table of its own: its section follows
        value = "(unset)" if field.default is None else f"= {toml(field.default)}"
        out += [
            ".TP",
            f"\\fB{esc(field.name)}\\fR {esc(value)}",
            prose(docs[field.name]),
            ".br",
            f"Takes {esc(takes(field.name, table))}.",
        ]
        given = flags(field.name, table)
        if given:
            out += [".br", f"On the command line: {esc(', '.join(given))}."]
    return out


def exitwatch_toml_5() -> str:
    out = [
        header("exitwatch.toml", 5, "File Formats"),
        ".SH NAME",
        "exitwatch.toml \\- settings of the exitwatch agent",
        ".SH SYNOPSIS",
        f".I {esc(DEFAULT_PATH)}",
        ".SH DESCRIPTION",
        CONFIG_DESCRIPTION.strip(),
        ".SH SETTINGS",
        *_settings(Config, field_docs(Config), table=False),
        f'.SS "[{TABLE}]"',
        prose(Adopt.__doc__ or ""),
        *_settings(Adopt, field_docs(Adopt), table=True),
    ]
    out += [
        ".SH EXAMPLE",
        ".EX",
        esc(CONFIG_EXAMPLE.rstrip()),
        ".EE",
        ".PP",
        CONFIG_NOTES.strip(),
        ".SH SEE ALSO",
        "exitwatch(8), exitwatch\\-run(1), systemctl(1)",
    ]
    return "\n".join(out) + "\n"


# -- exitwatch-run(1) ---------------------------------------------------------------------

RUN_DESCRIPTION = r"""
The wrapper is the owner of everything the run creates, and CMD is its child: CMD dies with
it (its parent\-death signal is SIGKILL). It needs no agent and no root: it works with the
caller's own rights.
.PP
The socket forwards every connection to the engine the caller would have used, and adds
.B exitwatch.owner=\fIowner\fR
to the labels of every container, network and volume created through it, and creates,
labelled, the named volumes a container create would make the engine create; a volume that
existed before keeps its labels. A request that names its own owner, or asks
.BR exitwatch.keep=true ,
is left as it is. Everything else passes unchanged: attached and
.B exec \-i
streams, logs, events, cp, build, compose v1 and v2, the Python SDK. A legacy build is
asked to remove its intermediate containers even when a step fails, as
.B docker build \-\-force\-rm
does, unless it asked to keep them.
.PP
The socket reads each request as the engine will. Where it cannot be sure how the engine
reads one, it refuses it with an error answer like the engine's own
.RB ( "exitwatch: ..." ):
400 for a creation body that is not one JSON object in UTF\-8, or that spells a field the
socket reads otherwise than the engine names it, or twice; 413 for a creation body over
4 MiB; 408 for one that has not come 10 s after its head.
.PP
When CMD ends, however it ends (SIGKILL and the OOM killer included), the wrapper sends
SIGTERM to every process CMD left behind (it is their child subreaper, so those that called
setsid are among them), then SIGKILL after
.B \-\-grace
seconds; it then removes the run's containers (compose projects as a whole), networks and
volumes, its TMPDIR and its socket's directory, with the agent's own removal code and
safety rules, and exits with CMD's status. When no engine answers, CMD's Docker clients see
their connection closed at once, and the cleanup removes only the directories.
.PP
If the wrapper itself is SIGKILLed, CMD dies with it, and the agent
.RB ( exitwatch (8)),
if one runs, reaps what carries the run's owner like any other owner's: the containers,
networks and volumes by their label, the TMPDIR and the socket's directory by their
markers (when they lie under the agent's workdir roots, /tmp by default), and the
processes CMD left behind (see
.B kill_leftovers
in
.BR exitwatch.toml (5)).
"""

RUN_SECTIONS = r"""
.SH ENVIRONMENT
CMD's environment is the caller's, with these changes:
.TP
.B DOCKER_HOST
unix://\fIthe run's socket\fR, in a fresh 0700 directory under XDG_RUNTIME_DIR (when its
path is short enough for a socket address, and safe: see below), or /tmp.
.TP
.BR EXITWATCH_OWNER ", " EXITWATCH_RUN
The run's owner: the first for compose files and runners that label, the second marks
CMD's processes as the run's for the agent.
.TP
.B TMPDIR
A fresh directory marked with the owner, under the caller's TMPDIR (when it is safe: see
below) or /tmp; left as it is with
.BR \-\-no\-tmpdir .
.PP
A directory named by XDG_RUNTIME_DIR or TMPDIR is used only if no other user can rename or
replace what the run makes in it: every component of its path, from / down, symlinks
included, belongs to root or to the caller, and each one that its group or others may write
to is sticky, as /tmp is. Otherwise the run uses /tmp, checked the same way, and says which
directory it did not use and why, in one line. Root given a user's directories (after
.B su
without
.BR \- )
is what this is for: that user could otherwise put a socket of their own in the place of
the run's.
.PP
The wrapper forwards to the engine of the caller's DOCKER_HOST, or /var/run/docker.sock;
only a unix:// engine can be forwarded to.
.SH SIGNALS
SIGINT, SIGTERM, SIGHUP and SIGQUIT sent to the wrapper are passed on to CMD, and the
wrapper waits for it; a second SIGINT or SIGTERM kills CMD. Ctrl\-C in a terminal reaches
CMD straight from the terminal, and the wrapper does not add one of its own.
.SH EXIT STATUS
CMD's exit status, or 128+\fIN\fR if signal \fIN\fR ended it. Of the wrapper's own:
.TP
.B 2
Bad use (no CMD, an unknown option): one line, and nothing is run.
.TP
.B 125
The run cannot be set up: a DOCKER_HOST that is not unix:// (tcp:// or ssh://, whose TLS
or tunnel the socket would have to speak again), no room for its directories, or no safe
directory for them, /tmp included.
.TP
.B 126
CMD cannot be executed.
.TP
.B 127
CMD cannot be found.
.SH DIAGNOSTICS
The wrapper writes only to stderr, one line a message, each starting with
.RB \(lq "exitwatch run:" \(rq.
It says which directory named by XDG_RUNTIME_DIR or TMPDIR it did not use, and why; why
the run cannot start; why CMD cannot run; each container, network, volume or directory of
the run that it could not remove, and why; an engine that took the run's connections but
does not answer at the end, whose containers, networks and volumes of the run stay for the
agent to reap by their label; and the processes still running after SIGKILL, by pid, once
5 s have passed.
.SH BUGS
Files written anywhere but TMPDIR stay (a runner that takes a workdir option can be pointed
into it). Docker clients that ignore DOCKER_HOST (\-H, \-\-context, a base_url of their own)
create what carries no label, and the engine forwarded to is never the current Docker
context's.
.SH SEE ALSO
exitwatch(8), exitwatch.toml(5), docker(1)
"""


def exitwatch_run_1() -> str:
    top = root()
    run = cli.get_command(top, "run")
    assert run is not None
    ctx = click.Context(run, info_name="run", parent=top, **run.context_settings)
    out = [
        header("exitwatch-run", 1, "User Commands"),
        ".SH NAME",
        f"exitwatch\\-run \\- {summary(run)}",
        ".SH SYNOPSIS",
        ".B exitwatch run",
        esc(" ".join(run.collect_usage_pieces(ctx))),
        ".SH DESCRIPTION",
        *paragraphs(run.help or "")[1:],
        ".PP",
        RUN_DESCRIPTION.strip(),
        ".SH OPTIONS",
        *options(run, ctx),
        RUN_SECTIONS.strip(),
    ]
    return "\n".join(out) + "\n"


PAGES: dict[str, Callable[[], str]] = {
    "exitwatch.8": exitwatch_8,
    "exitwatch.toml.5": exitwatch_toml_5,
    "exitwatch-run.1": exitwatch_run_1,
}


def render(page: str) -> str:
    return PAGES[page]()


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in PAGES:
        print(f"usage: manpage.py PAGE, one of {', '.join(PAGES)}", file=sys.stderr)
        sys.exit(2)
    sys.stdout.write(render(sys.argv[1]))
