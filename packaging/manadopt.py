"""exitwatch-adopt(8): `exitwatch adopt`, from its click help and the prose below (which
says what docs/adopt.md says, for a host that has only the package)."""

from __future__ import annotations

import click
from mansource import esc, header, options, paragraphs, root, summary

from exitwatch.cli import cli

DESCRIPTION = r"""
.B exitwatch run
adopts a runner started under it. Two kinds of runner are started otherwise: one inside a
container that drives the host's engine through a mounted /var/run/docker.sock (where
nothing can name an owner the host understands, so
.B exitwatch labels
refuses to run), and one started by cron, a scheduler or somebody else's script.
.PP
.B exitwatch adopt
serves a Docker socket that stands where the engine's would, for every client at once. It
learns each connection's client from the kernel (SO_PEERCRED: its host pid, even from
inside a container), finds the client's owner, and labels what the connection creates
(containers, networks, volumes) with
.B exitwatch.owner=\fIowner\fR
and
.BR exitwatch.owner\-name ,
what the owner is (\fBcontainer\fR \fINAME\fR for a container's init; for a process a rule
matched, its program's name and the rule, never its arguments, which may hold a secret),
as the socket of
.BR exitwatch\-run (1)
does. The agent,
.BR exitwatch (8),
reaps by that label, as it reaps any dead owner's: it must run too.
A request that names an owner of its own, or asks
.BR exitwatch.keep=true ,
is left as it is; an
.B exitwatch.owner
label that names nobody (empty, as compose makes
.B \(dq${EXITWATCH_OWNER}\(dq
where the variable is unset, or malformed) is replaced by the connection's owner; every
other request passes unchanged.
"""

OWNERS = r"""
.TP
In an owner container
A container labelled
.BR exitwatch.adopt=owner ,
or whose name or image a pattern of
.B containers
matches (a runner container): the nearest process in the container, from the client up,
whose command line a rule matches; else the container's init, as the host names it.
.BR "docker kill" ,
an OOM kill, a crash and
.B docker restart
all end that init, and what it made is reaped. Clients entered into it
.RB ( "docker exec" )
and clients of one started with
.B \-\-pid=host
(known by the container's cgroup) are its too.
.TP
In any other container, or on the host
The nearest process, from the client up, whose command line a rule matches; else nobody:
the connection passes through untouched and unlabelled, so an operator's own
.B docker run \-d
is never removed, and what a launcher, a manager, Portainer or Watchtower starts from a
container outlives it.
.TP
A dead owner's orphan
A host client left in the process group of a rule\-matched owner that led the group and
has died (its children, reparented to init, and theirs): its creations are refused, so a
SIGKILL of a runner that leads its group leaves nothing.
.TP
One whose owner cannot be found for sure
(a transient /proc error, a client gone before it was read): its creations are refused
with an error answer that says why
.RB ( "exitwatch: creations are refused here: ..." );
its other requests pass. Nothing is passed on unlabelled.
.PP
A rule is an fnmatch pattern matched against a process's arguments joined by single
spaces, such as
.B \(dqbench eval *\(dq
or
.BR \(dq*/inspect\ eval\ *\(dq ;
rules are set by
.B rules
in the
.B [adopt]
table of
.BR exitwatch.toml (5),
or by
.BR \-\-rule .
A container is an owner by its label
.B exitwatch.adopt=owner
or by
.B containers
in the
.B [adopt]
table (fnmatch patterns over its name and its image), or by
.BR \-\-container .
.BR "exitwatch status"
shows an adopted owner with what it is:
.I container NAME
for a container's init.
"""

SOCKET = r"""
Under systemd, exitwatch\-adopt.socket holds /run/exitwatch/docker.sock, root:docker 0660
like Debian's engine socket, and passes it at every start; the service starts with its
first client. The service gives the socket the engine socket's owner, group and mode, never
more, and refuses to serve one wider than the engine's. The file is never unlinked and made
again: a container that bind\-mounted it keeps the same file across restarts and crashes
of the service, and clients that connect while the service is down wait in its backlog.
Run by hand, it binds
.B \-\-listen
itself, and only where nothing is.
"""

EXIT_STATUS = r"""
.TP
.B 0
Stopped by SIGTERM or SIGINT.
.TP
.B 1
It cannot serve: one line on stderr saying why and what to do (not root, not in the host's
pid namespace, a bad setting, a DOCKER_HOST that is not unix://, a socket path taken or too
long, the engine's own socket given as the one to serve).
.TP
.B 2
Bad use: an unknown option or a bad value.
"""

ENVIRONMENT = r"""
.TP
.B DOCKER_HOST
The engine forwarded to, when neither
.B [adopt] docker_host
nor
.B [containers] docker_host
is set; unset too: /var/run/docker.sock. Only a unix:// socket can be forwarded to.
exitwatch\-adopt.service unsets it (UnsetEnvironment=): under systemd, only the settings
name the engine. A podman service's socket may be the engine: the podman CLI's clients
(CONTAINER_HOST at the adopt socket) are labelled as Docker clients are, and
.B podman kube play
is refused.
.TP
.BR LISTEN_PID ", " LISTEN_FDS
Set by systemd: the one listening socket to serve (sd_listen_fds(3)); they are not passed
on.
"""

EXAMPLES = r"""
Turn it on; the agent must run too:
.PP
.EX
systemctl enable \-\-now exitwatch exitwatch\-adopt.socket
.EE
.PP
A runner in a container mounts the adopt socket where its clients look for the engine,
and is labelled an owner;
.BR "docker kill" ,
.B docker stop
or an OOM kill of the runner's container removes all it created:
.PP
.EX
docker run \-d \-\-name runner \-\-label exitwatch.adopt=owner \e
    \-v /run/exitwatch/docker.sock:/var/run/docker.sock \e
    my\-runner\-image my\-runner \-\-its \-\-arguments
.EE
.PP
Or, without the label, name the runner containers in /etc/exitwatch/config.toml:
.PP
.EX
[adopt]
containers = ["runner\-*", "my\-runner\-image:*"]
.EE
.PP
Runners on the host: point DOCKER_HOST at the socket (in /etc/environment for login
sessions, su and cron; in
.B DefaultEnvironment=
of systemd\-system.conf(5) for services) and give their command lines rules in
/etc/exitwatch/config.toml:
.PP
.EX
# /etc/environment
DOCKER_HOST=unix:///run/exitwatch/docker.sock

# /etc/exitwatch/config.toml
[adopt]
rules = ["bench eval *", "*/inspect eval *"]
.EE
.PP
By hand, on another path:
.PP
.EX
exitwatch adopt \-\-listen /run/adopt.sock \-\-rule \(aqbench eval *\(aq
.EE
"""

FILES = r"""
.TP
.I /run/exitwatch/docker.sock
The socket served (exitwatch\-adopt.socket's; \fB\-\-listen\fR, or \fBlisten\fR in
.BR [adopt] ,
by hand).
.TP
.I /etc/exitwatch/config.toml
The
.B [adopt]
table:
.BR listen ", " docker_host ", " rules ", " containers
.RB ( exitwatch.toml (5)).
.TP
.I /lib/systemd/system/exitwatch\-adopt.socket
The socket unit, with exitwatch\-adopt.service beside it; both disabled until enabled.
"""

BUGS = r"""
A client that sets its own DOCKER_HOST, \fB\-H\fR or a Docker context bypasses the socket.
A container that mounted the engine's socket rather than the adopt socket is not adopted.
A container that mounts the adopt socket without the label or a pattern is no owner: a
runner container set up before the label existed needs it added.
A dead owner's orphan is found only in the process group the owner led, and only if the
service saw the owner create something: one that left the group (setsid, setpgid), or the
children of a runner that does not lead its group, pass through as host clients do.
"""


def exitwatch_adopt_8() -> str:
    top = root()
    adopt = cli.get_command(top, "adopt")
    assert adopt is not None
    ctx = click.Context(adopt, info_name="adopt", parent=top, **adopt.context_settings)
    out = [
        header("exitwatch-adopt", 8, "System Administration"),
        ".SH NAME",
        f"exitwatch\\-adopt \\- {summary(adopt)}",
        ".SH SYNOPSIS",
        ".B exitwatch adopt",
        esc(" ".join(adopt.collect_usage_pieces(ctx))),
        ".SH DESCRIPTION",
        # Its help's pointer to this very page left out.
        *paragraphs((adopt.help or "").replace(" exitwatch-adopt(8) has the recipes.", "")),
        ".PP",
        DESCRIPTION.strip(),
        ".SH OPTIONS",
        *options(adopt, ctx),
        ".SH OWNERS",
        OWNERS.strip(),
        ".SH THE SOCKET",
        SOCKET.strip(),
        ".SH EXIT STATUS",
        EXIT_STATUS.strip(),
        ".SH ENVIRONMENT",
        ENVIRONMENT.strip(),
        ".SH FILES",
        FILES.strip(),
        ".SH EXAMPLES",
        EXAMPLES.strip(),
        ".SH BUGS",
        BUGS.strip(),
        ".SH SEE ALSO",
        "exitwatch(8), exitwatch\\-run(1), exitwatch.toml(5), exitwatch\\-files(5), "
        "systemd.socket(5), docker(1)",
    ]
    return "\n".join(out) + "\n"
