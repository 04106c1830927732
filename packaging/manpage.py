"""Write exitwatch(8) to stdout, from the click CLI's own help.

Run at package build time (debian/rules), so the page lists exactly the commands and
options of the CLI it ships with; only the prose around them lives here.
Usage: PYTHONPATH=. python3 packaging/manpage.py > exitwatch.8
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator

import click

from exitwatch import __version__
from exitwatch.cli import cli

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
hook once it exits 0.
"""

FILES = [
    ("/etc/exitwatch/config.toml", "Agent settings (TOML); options on the command line win."),
    ("/var/lib/exitwatch/", "State directory: the audit log of removals and refusals."),
    ("/run/exitwatch/", "Runtime directory: the status socket."),
    ("/var/spool/exitwatch/hooks/", "On-death hooks (mode 1733: anyone adds, only root lists)."),
    ("/lib/systemd/system/exitwatch.service", "The hardened systemd unit."),
]

SEE_ALSO = "systemctl(1), journalctl(1), docker(1), docker\\-compose(1), systemd.exec(5)"


def esc(text: str) -> str:
    """Plain text as roff: backslashes and hyphens escaped, no line read as a request."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\n".join(
        "\\&" + line if line.startswith((".", "'")) else line for line in text.splitlines()
    )


Commands = Iterator[tuple[click.Command, click.Context]]


def commands(group: click.Group, ctx: click.Context) -> Commands:
    """Every visible command under `group`, depth first, each with its own context."""
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        if cmd is None or cmd.hidden:
            continue
        sub = click.Context(cmd, info_name=name, parent=ctx, **cmd.context_settings)
        yield cmd, sub
        if isinstance(cmd, click.Group):
            yield from commands(cmd, sub)


def options(cmd: click.Command, ctx: click.Context) -> Iterator[str]:
    """One .TP paragraph per option, as `--help` words it (defaults and choices included)."""
    for param in cmd.get_params(ctx):
        record = param.get_help_record(ctx)
        if record is None:  # arguments: named in the usage line
            continue
        opts, text = record
        yield f".TP\n.B {esc(opts)}\n{esc(text) if text else ''}".rstrip()


def render() -> str:
    root = click.Context(cli, info_name="exitwatch", **cli.context_settings)
    epoch = float(os.environ.get("SOURCE_DATE_EPOCH", time.time()))
    date = time.strftime("%Y-%m-%d", time.gmtime(epoch))
    summary = (cli.help or "").splitlines()[0].rstrip(".")
    out = [
        f'.TH EXITWATCH 8 "{date}" "exitwatch {__version__}" "System Administration"',
        ".SH NAME",
        f"exitwatch \\- {esc(summary[:1].lower() + summary[1:])}",
        ".SH SYNOPSIS",
        ".B exitwatch",
        esc(" ".join(cli.collect_usage_pieces(root))),
        ".SH DESCRIPTION",
        DESCRIPTION.strip(),
        ".SH OPTIONS",
        *options(cli, root),
        ".SH COMMANDS",
    ]
    for cmd, ctx in commands(cli, root):
        out += [
            f'.SS "{esc(ctx.command_path)} {esc(" ".join(cmd.collect_usage_pieces(ctx)))}"',
            esc(cmd.help or cmd.short_help or ""),
            *options(cmd, ctx),
        ]
    out.append(".SH FILES")
    for path, what in FILES:
        out += [".TP", f".I {esc(path)}", esc(what)]
    out += [".SH SEE ALSO", SEE_ALSO]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
