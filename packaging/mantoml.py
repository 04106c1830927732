"""exitwatch.toml(5): every setting, from the Config dataclass (mansource.py reads it), and
the prose around them."""

from __future__ import annotations

from dataclasses import fields

from mansource import aliases, esc, field_docs, flags, header, prose, takes, toml

from exitwatch.kinds import registry
from exitwatch.service.config import DEFAULT_PATH, TABLE, Adopt, Config

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

KIND_TABLE = """The {kind} kind's settings. `enabled = false` turns the kind off: the agent
neither follows nor removes what it would."""

CONFIG_EXAMPLE = """\
source = "netlink"
metrics_addr = "127.0.0.1:9788"
reconcile_interval = 300

[workdirs]
roots = ["/tmp", "/var/tmp", "/scratch"]

[processes]
enabled = false

[adopt]
rules = ["*/inspect eval *", "bench eval *"]
containers = ["runner-*"]
"""

CONFIG_NOTES = r"""
Under exitwatch.service the agent may write only under /tmp and /var/tmp: a workdir root
elsewhere, such as /scratch above, also needs
.B ReadWritePaths=
in a drop\-in
.RB ( "systemctl edit exitwatch" ).
"""


def _settings(of: type, docs: dict[str, str], table: str | None) -> list[str]:
    out = []
    for field in fields(of):
        if table is None and field.name in (TABLE, "kinds"):
            continue  # tables of their own: their sections follow
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
        *_settings(Config, field_docs(Config), table=None),
    ]
    for reg in registry.KINDS:
        out += [f'.SS "[{reg.table}]"', prose(KIND_TABLE.format(kind=reg.kind))]
        out += _settings(reg.settings, field_docs(reg.settings), table=reg.table)
        spelled = [f"{old} ({new})" for old, new in aliases(reg.table).items()]
        if spelled:
            # The flat names the options set; most are also how the key was spelled
            # before the tables (not lease_dir and watchdog_dir, which came after).
            said = f"Also read at the top level, by its flat name: {', '.join(spelled)}"
            out += [".PP", esc(said + "; each use is one warning in the log.")]
    out += [
        f'.SS "[{TABLE}]"',
        prose(Adopt.__doc__ or ""),
        *_settings(Adopt, field_docs(Adopt), table=TABLE),
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
