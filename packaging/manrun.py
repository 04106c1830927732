"""exitwatch-run(1): `exitwatch run`, from its click help and the prose below."""

from __future__ import annotations

import click
from mansource import esc, header, options, paragraphs, root, summary

from exitwatch.cli import cli

RUN_DESCRIPTION = r"""
The wrapper is the owner of everything the run creates, and CMD is its child: CMD dies with
it (its parent\-death signal is SIGKILL). It needs no agent and no root: it works with the
caller's own rights; only
.B \-\-max\-time
and
.BR \-\-idle\-timeout ,
which the agent enforces, need an agent (see TIMEOUTS).
.PP
The socket forwards every connection to the engine the caller would have used, and adds
.B exitwatch.owner=\fIowner\fR
to the labels of every container, network and volume created through it, and creates,
labelled, the named volumes a container create would make the engine create; a volume that
existed before keeps its labels. A request that names its own owner, or asks
.BR exitwatch.keep=true ,
is left as it is; an
.B exitwatch.owner
label that names nobody (empty or malformed) is replaced by the run's owner. Everything
else passes unchanged: attached and
.B exec \-i
streams, logs, events, cp, build, compose v1 and v2, the Python SDK. A legacy build is
asked to remove its intermediate containers always, a failed or interrupted step's
included, as
.B docker build \-\-force\-rm
does, whatever
.B rm
it sent: the build API cannot label them, and kept they would be nobody's.
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
processes CMD left behind (the
.B [processes]
table of
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
.B CONTAINER_HOST
When the caller has one (the podman CLI is then remote, and speaks podman's own API to
it): unix://\fIthe run's socket\fR, the same socket as DOCKER_HOST's when both name one
engine, else a second one beside it, in front of the podman service CONTAINER_HOST names
(unix:///\fIpath\fR, unix://\fIpath\fR or unix:/\fIpath\fR). Podman's creations are
labelled as Docker's are: containers and their named volumes, pods, networks, volumes;
.B podman kube play
and
.B podman container restore \-\-import
are refused, with a line the CLI prints: what they make would carry no owner.
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
The wrapper itself reads EXITWATCH_WATCHDOG_DIR, the agent's watchdog spool, for
.B \-\-max\-time
and
.BR \-\-idle\-timeout .
.PP
The wrapper forwards to the engine of the caller's DOCKER_HOST, or /var/run/docker.sock,
and to the podman service of its CONTAINER_HOST; only a local socket can be forwarded to.
.SH TIMEOUTS
.B \-\-max\-time
and
.B \-\-idle\-timeout
arm the agent's watchdog on the wrapper, the run's owner, before CMD starts; the agent
then ends the run even when what hangs is the wrapper. With no agent's watchdog spool to
arm it in (EXITWATCH_WATCHDOG_DIR, else /var/spool/exitwatch/watchdogs) the run exits 125
with one line, and runs nothing.
.PP
.B \-\-max\-time
ends the run S seconds after the wrapper started.
.B \-\-idle\-timeout
ends it once CMD (with its descendants) has written nothing to its stdout or stderr for S
seconds: for it, CMD's stdout and stderr are pipes of the wrapper's, copied to the
wrapper's own as output comes, so CMD sees no terminal there (no colour, block\-buffered
output that counts only once flushed). With both, the watchdog is armed for the nearer
end and petted on output; once less than the idle timeout is left of the maximum time,
it is armed again for what is left, and petted no more.
.PP
At the end the agent sends the wrapper SIGTERM, which the wrapper passes on to CMD (see
SIGNALS); once CMD ends the wrapper cleans up as ever and exits with CMD's status (143 for
a CMD that SIGTERM killed). A wrapper still running
.B \-\-grace
seconds after that SIGTERM is SIGKILLed by the agent, which then reaps what the run held.
The agent's log and audit log say why the run was ended, and the wrapper says so in one
line on stderr as the SIGTERM comes.
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
The run cannot be set up: a DOCKER_HOST or CONTAINER_HOST that is not a local socket
(tcp:// or ssh://, whose TLS or tunnel the socket would have to speak again), no room for
its directories, or no safe directory for them, /tmp included;
.B \-\-max\-time
or
.B \-\-idle\-timeout
with no agent's watchdog to arm.
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
context's. The podman CLI without CONTAINER_HOST works on its storage directly, through no
socket, and what it makes carries no label.
.SH EXAMPLES
A runner, as it is: whatever it leaves (containers, networks, volumes, TMPDIR, processes)
goes when it ends, however it ends:
.PP
.EX
exitwatch run \-\- bench eval run \-\-tasks\-dir tasks \-\-agent oracle \-\-jobs\-dir jobs
.EE
.PP
Ten seconds for what it leaves running to stop on SIGTERM before SIGKILL:
.PP
.EX
exitwatch run \-\-grace 10 \-\- python my_eval.py
.EE
.PP
Ended by the agent after four hours, or after fifteen minutes without output:
.PP
.EX
exitwatch run \-\-max\-time 14400 \-\-idle\-timeout 900 \-\- python my_eval.py
.EE
.SH SEE ALSO
exitwatch(8), exitwatch.toml(5), exitwatch\-adopt(8), exitwatch\-files(5), docker(1),
podman\-remote(1)
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
