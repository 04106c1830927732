"""What packaging/manpage.py generates its pages from, as roff: the click CLI (its commands,
their usage and options, as `--help` words them) and the Config dataclass (each field's
default, the docstring after it, the values validate() takes, the options that set it)."""

from __future__ import annotations

import ast
import inspect
import os
import re
import time
import types
import typing
from collections.abc import Iterator
from dataclasses import replace

import click

from exitwatch import __version__
from exitwatch.cli import cli
from exitwatch.kinds import registry
from exitwatch.service.config import TABLE, Adopt, Config, ConfigError


def esc(text: str) -> str:
    """Plain text as roff: backslashes and hyphens escaped, no line read as a request."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\n".join(
        "\\&" + line if line.startswith((".", "'")) else line for line in text.splitlines()
    )


def prose(text: str) -> str:
    """A docstring as roff: escaped, its `code` in bold."""
    return re.sub(r"`([^`]+)`", r"\\fB\1\\fR", esc(inspect.cleandoc(text)))


def paragraphs(text: str) -> list[str]:
    """A click help text as roff paragraphs, dedented as `--help` dedents it
    (inspect.cleandoc): each paragraph filled as one, with its `code` in bold; one that click
    keeps as written (its first line is "\\b") is kept so, as an example."""
    out = []
    for para in inspect.cleandoc(text).split("\n\n"):
        if para.startswith("\b\n"):
            lines = inspect.cleandoc(para[2:]).splitlines()
            out.append(".PP\n.EX\n" + esc("\n".join(lines)) + "\n.EE")
        else:
            out.append(".PP\n" + prose(" ".join(para.split())))
    return out


def header(name: str, section: int, manual: str) -> str:
    epoch = float(os.environ.get("SOURCE_DATE_EPOCH", time.time()))
    date = time.strftime("%Y-%m-%d", time.gmtime(epoch))
    th = f'.TH {esc(name.upper())} {section} "{date}" "exitwatch {__version__}" "{manual}"'
    # No hyphenation, so that names such as EXITWATCH_RUN stay whole: .nh for now, and HY
    # (groff_man(7)) for after each example, whose .EE would turn it on again.
    return th + "\n.nh\n.nr HY 0"


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
        record = param.get_help_record(ctx) if isinstance(param, click.Option) else None
        if record is None:  # arguments: named in the usage line
            continue
        opts, text = record
        yield f".TP\n.B {esc(opts)}\n{esc(text) if text else ''}".rstrip()


def root() -> click.Context:
    return click.Context(cli, info_name="exitwatch", **cli.context_settings)


def summary(cmd: click.Command) -> str:
    """The NAME line's words: the help's first sentence, up to a colon."""
    first = " ".join(inspect.cleandoc(cmd.help or "").split("\n\n")[0].split())
    first = first.split(". ")[0].split(": ")[0].rstrip(".")
    return esc(first[:1].lower() + first[1:])


# A value of each type that every check in Config.validate() refuses, so that its message
# says what the key takes.
_OUT_OF_RANGE: dict[type, object] = {str: "\0", int: -1, float: -1.0, tuple: ("\0",)}
_TOML_TYPES = {
    str: "string",
    bool: "boolean",
    int: "integer",
    float: "number",
    tuple: "array of strings",
}


def field_docs(of: type = Config) -> dict[str, str]:
    """Each field's docstring (of Config, or of its table Adopt): the string literal that
    follows the field."""
    body = ast.parse(inspect.cleandoc(inspect.getsource(of))).body[0]
    assert isinstance(body, ast.ClassDef)
    docs = {}
    for stmt, after in zip(body.body, body.body[1:], strict=False):
        if (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[stmt.target.id] = after.value.value
    return docs


def _type(name: str, of: type = Config) -> type:
    hint = typing.get_type_hints(of)[name]
    if isinstance(hint, types.UnionType):  # `str | None`: unset, or a string
        return next(a for a in typing.get_args(hint) if a is not type(None))
    return typing.get_origin(hint) or hint


def settings_of(table: str | None) -> type:
    """The dataclass of the top level (None), of the [adopt] table, or of a kind's."""
    if table is None:
        return Config
    return Adopt if table == TABLE else type(Config().kind(table))


def _with(table: str | None, name: str, value: object) -> Config:
    """The default config with key `name` of `table` (None: the top level) set."""
    config = Config()
    if table is None:
        return replace(config, **{name: value})
    if table == TABLE:
        return replace(config, adopt=replace(config.adopt, **{name: value}))
    return replace(
        config, kinds={**config.kinds, table: replace(config.kind(table), **{name: value})}
    )


def takes(name: str, table: str | None = None) -> str:
    """What key `name` (of `table`; None: the top level) takes, in the words of
    Config.validate()."""
    kind = _type(name, settings_of(table))
    bad = _OUT_OF_RANGE.get(kind)
    if bad is not None:
        try:
            _with(table, name, bad).validate()
        except ConfigError as err:
            key = f"{table}.{name}" if table else name
            said = re.match(rf"{re.escape(key)}: expected (.*), got ", str(err))
            if said:
                return said[1]
    return "true or false" if kind is bool else f"a {_TOML_TYPES[kind]}"


def aliases(table: str) -> dict[str, str]:
    """A kind's flat keys of the file's top level, still read: flat name → its field."""
    return dict(next(reg.aliases for reg in registry.KINDS if reg.table == table))


def toml(value: object) -> str:
    """A default as it is written in the file."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, tuple):
        return "[" + ", ".join(toml(v) for v in value) + "]"
    return repr(value)


def flags(name: str, table: str | None = None) -> list[str]:
    """The command-line options that set key `name` of `table` (None: the top level), with
    the commands that take them: for the [adopt] table those of `exitwatch adopt`, whose own
    names may start with "adopt_"; for a kind's, those named as the key's flat alias."""
    top, found = root(), {}
    if table is None:
        names = {name}
    elif table == TABLE:
        names = {name, f"{TABLE}_{name}"}
    else:
        names = {old for old, new in aliases(table).items() if new == name}
    for cmd, ctx in commands(cli, top):
        if (ctx.command_path == f"exitwatch {TABLE}") != (table == TABLE):
            continue
        for param in cmd.get_params(ctx):
            if isinstance(param, click.Option) and param.name in names:
                found.setdefault(param.opts[-1], []).append(ctx.command_path)
    return [f"{opt} ({', '.join(where)})" for opt, where in found.items()]
