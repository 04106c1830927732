"""The agent's settings: one frozen dataclass whose fields carry their defaults, and the
TOML file that sets them."""

from __future__ import annotations

import functools
import os
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from exitwatch.engine import url
from exitwatch.sources import MODES

DEFAULT_PATH = "/etc/exitwatch/config.toml"
TABLE = "adopt"  # the table of `exitwatch adopt` (Config.adopt); each kind has its own


class ConfigError(ValueError):
    """One line naming the file, the key and what is expected."""


@dataclass(frozen=True)
class Adopt:
    """The `[adopt]` table: `exitwatch adopt`, one labelling Docker socket for the whole
    host (exitwatch-adopt(8))."""

    listen: str = "/run/exitwatch/docker.sock"
    """The socket it serves, when systemd passes it none (exitwatch-adopt.socket does); it
    is bound only where nothing is, and takes the engine socket's owner, group and mode."""
    docker_host: str | None = None
    """The engine it forwards to, a unix:// URL; unset: the agent's `docker_host`, else
    DOCKER_HOST, else the default socket."""
    rules: tuple[str, ...] = ()
    """Command lines that own what their descendants create through the socket: fnmatch
    patterns matched against a process's arguments joined by single spaces, such as
    "*/inspect eval *". The nearest matching process from the client up is the owner; with
    no match, the init of an owner container (below) for its clients; else nobody."""
    containers: tuple[str, ...] = ()
    """Containers that own what their clients create through the socket (runner containers,
    Recipe 1): fnmatch patterns matched against a container's name and its image, such as
    "runner-*" or "my-runner-image:*". A container labelled exitwatch.adopt=owner is one
    too. Any other container that reaches the socket is a client as a host process is."""


def _kind_defaults() -> dict[str, Any]:
    """Every kind's settings table at its defaults, by table name. The kinds are imported
    here, when a Config is made, not with this module: `exitwatch run` and `labels` load
    the command line, never a config."""
    from exitwatch.kinds import registry

    return {reg.table: reg.settings() for reg in registry.KINDS}


@dataclass(frozen=True)
class Config:
    source: str = "auto"
    """Exit source: auto (ebpf, then netlink, then poll), ebpf, netlink or poll."""
    dry_run: bool = False
    """Log what would be removed, remove nothing."""
    poll_interval: float = 1.0
    """Seconds between procfs checks of the watched owners (poll source)."""
    ebpf_max_owners: int = 65536
    """Owners the ebpf source watches in the kernel; the rest are polled."""
    reap_workers: int = 16
    """Removals run in parallel on this many threads."""
    reap_attempts: int = 3
    """A removal that fails is tried this many times in all, 0.5 s, 2 s, 8 s, ... apart: the
    agent's attempts. Within each, the container kind sends each engine call up to 3 times
    (0.2 s, then 0.4 s apart), so the engine may be asked 3 times reap_attempts; the log
    line of a failure says its tries, and the last one the attempts. `exitwatch reap` also
    judges an owner whose liveness cannot be read this many times, a second apart."""
    reconcile_interval: float = 600.0
    """Seconds between full listings of every kind, which retry what was missed, refused or
    given up; 0: only at start."""
    status_socket: str = "/run/exitwatch/exitwatch.sock"
    """The read-only unix socket that `exitwatch status` asks."""
    audit_log: str = "/var/lib/exitwatch/audit.jsonl"
    """Append-only JSON-lines record of every removal and refusal; empty string: none."""
    audit_max_bytes: int = 16 * 1024 * 1024
    """The audit log is rotated (one old file, .1) when it grows past this size."""
    metrics_addr: str | None = None
    """Serve Prometheus metrics on HOST:PORT; unset: no metrics."""
    log_format: str = "text"
    """Log lines on stderr as "text" or "json"."""
    adopt: Adopt = Adopt()
    """The `[adopt]` table: the settings of `exitwatch adopt` (below)."""
    kinds: Mapping[str, Any] = field(default_factory=_kind_defaults)
    """Each kind's table ([containers], [workdirs], [hooks], [processes]), by its name:
    the kind's own settings, `enabled` first (kinds/registry.py)."""

    def kind(self, table: str) -> Any:
        """The settings of the kind whose table is `table`."""
        return self.kinds[table]

    def describe(self) -> str:
        return " ".join(f"{k}={v!r}" for k, v in asdict(self).items())

    def updated(self, values: Mapping[str, object], notes: list[str] | None = None) -> Config:
        """This config with `values` set, by top-level key or by a kind's flat alias
        ("workdir_roots" sets [workdirs] roots); each alias used is told in `notes`, with
        its new spelling. Values are taken as they are: validate() checks them."""
        top: dict[str, Any] = {}
        tables = dict(self.kinds)
        for key, value in values.items():
            alias = _aliases().get(key)
            if alias is None:
                top[key] = value
                continue
            table, name = alias
            tables[table] = replace(tables[table], **{name: value})
            if notes is not None:
                notes.append(
                    f"{key} is spelled {name} in the [{table}] table now; {key} still works"
                )
        return replace(self, **top, kinds=tables)

    def validate(self) -> None:
        """Raise ConfigError(key: what is expected) for a value out of range."""
        checks = {
            "source": (self.source in MODES, f"one of {', '.join(MODES)}"),
            "poll_interval": (0.01 <= self.poll_interval <= 3600, "a number in 0.01..3600"),
            "ebpf_max_owners": (1 <= self.ebpf_max_owners <= 1 << 24, "an integer in 1..16777216"),
            "reap_workers": (1 <= self.reap_workers <= 256, "an integer in 1..256"),
            "reap_attempts": (1 <= self.reap_attempts <= 10, "an integer in 1..10"),
            "reconcile_interval": (
                self.reconcile_interval == 0 or 1 <= self.reconcile_interval <= 86400,
                "0 (off) or a number in 1..86400",
            ),
            "status_socket": (self.status_socket.startswith("/"), "an absolute path"),
            "audit_log": (
                self.audit_log == "" or self.audit_log.startswith("/"),
                'an absolute path, or "" for none',
            ),
            "audit_max_bytes": (self.audit_max_bytes >= 4096, "an integer of at least 4096"),
            "metrics_addr": (
                self.metrics_addr is None or parse_addr(self.metrics_addr) is not None,
                "HOST:PORT, e.g. 127.0.0.1:9788",
            ),
            "log_format": (self.log_format in ("text", "json"), "text or json"),
        }
        for key, (ok, expected) in checks.items():
            if not ok:
                raise ConfigError(f"{key}: expected {expected}, got {getattr(self, key)!r}")
        for table, settings in self.kinds.items():
            for key, (ok, expected) in settings.checks().items():
                if not ok:
                    got = getattr(settings, key)
                    raise ConfigError(f"{table}.{key}: expected {expected}, got {got!r}")
        self._validate_adopt()

    def _validate_adopt(self) -> None:
        adopt = self.adopt
        checks = {
            "listen": (
                adopt.listen.startswith("/") and 0 < len(os.fsencode(adopt.listen)) < 108,
                "an absolute path of less than 108 bytes (a socket's address)",
            ),
            "docker_host": (
                adopt.docker_host is None or url.valid(adopt.docker_host),
                url.EXPECTED,
            ),
            "rules": (
                all(r.strip() and "\0" not in r for r in adopt.rules),
                "a list of non-empty fnmatch patterns",
            ),
            "containers": (
                all(c.strip() and "\0" not in c for c in adopt.containers),
                "a list of non-empty fnmatch patterns",
            ),
        }
        for key, (ok, expected) in checks.items():
            if not ok:
                got = getattr(adopt, key)
                raise ConfigError(f"{TABLE}.{key}: expected {expected}, got {got!r}")


@functools.cache
def _aliases() -> dict[str, tuple[str, str]]:
    """Every kind's flat alias: key → (table, field)."""
    from exitwatch.kinds import registry

    return {
        alias: (reg.table, name) for reg in registry.KINDS for alias, name in reg.aliases.items()
    }


def parse_addr(addr: str) -> tuple[str, int] | None:
    """HOST:PORT (or [V6]:PORT) → (host, port), or None if malformed."""
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return host.strip("[]"), int(port)


_NAMES = {
    "str": "a string",
    "bool": "true or false",
    "int": "an integer",
    "float": "a number",
    "tuple": "a list of strings",
}


def _coerce(key: str, value: Any, of: type = Config, shown: str = "") -> object:
    """TOML value → field value of `of`, or ConfigError naming what the key expects."""
    hint = _hints(of)[key]
    want = typing.get_origin(hint) or hint
    if want is types.UnionType:  # `str | None`: TOML has no null, so a string it is
        want = str
    ok = {
        str: isinstance(value, str),
        bool: isinstance(value, bool),
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, int | float) and not isinstance(value, bool),
        tuple: isinstance(value, list) and all(isinstance(v, str) for v in value),
    }[want]
    if not ok:
        raise ConfigError(f"{shown or key}: expected {_NAMES[want.__name__]}, got {value!r}")
    return tuple(value) if want is tuple else float(value) if want is float else value


@functools.cache
def _hints(of: type) -> dict[str, Any]:
    return typing.get_type_hints(of)


def _table(name: str, value: object, base: Any) -> Any:
    """The table `name` of the file over `base`, its settings as they stand."""
    if not isinstance(value, dict):
        raise ConfigError(f"{name}: expected a table ([{name}]), got {value!r}")
    known = {f.name for f in fields(base)}
    values = {}
    for key, item in value.items():
        if key not in known:
            names = ", ".join(sorted(known))
            raise ConfigError(f"unknown key '{name}.{key}' (known in [{name}]: {names})")
        values[key] = _coerce(key, item, type(base), f"{name}.{key}")
    return replace(base, **values)


def _unreadable(err: OSError) -> str:
    """What to do about a config file that cannot be read."""
    if isinstance(err, FileNotFoundError):
        return " (give --config an existing file, or leave it out for the defaults)"
    if isinstance(err, PermissionError):
        return " (run as root, or make the file readable)"
    return ""


def load(path: str, base: Config | None = None, notes: list[str] | None = None) -> Config:
    """Read a TOML config file over `base` (default: the defaults). Each flat alias of a
    kind's setting that it uses is told in `notes`, with its new spelling."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as err:
        raise ConfigError(f"{path}: cannot read: {err.strerror}{_unreadable(err)}") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: not valid TOML: {err}") from None
    config = base or Config()
    tables = set(config.kinds)
    known = ({f.name for f in fields(Config)} - {TABLE, "kinds"}) | set(_aliases())
    flat: dict[str, object] = {}
    try:
        for key, value in data.items():
            if key == TABLE:
                config = replace(config, adopt=_table(TABLE, value, config.adopt))
            elif key in tables:
                kinds = dict(config.kinds) | {key: _table(key, value, config.kind(key))}
                config = replace(config, kinds=kinds)
            elif key in known:
                alias = _aliases().get(key)
                of = Config if alias is None else type(config.kind(alias[0]))
                flat[key] = _coerce(key if alias is None else alias[1], value, of, key)
            else:
                names = ", ".join(sorted(known | tables | {TABLE}))
                raise ConfigError(f"unknown key {key!r} (known: {names})")
        # A table's own spelling wins over a flat alias of the same setting.
        spelled = {k: v for k, v in flat.items() if not _set_in_table(k, data)}
        config = config.updated(spelled, notes)
        config.validate()
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None
    return config


def _set_in_table(key: str, data: Mapping[str, object]) -> bool:
    alias = _aliases().get(key)
    if alias is None:
        return False
    table = data.get(alias[0])
    return isinstance(table, dict) and alias[1] in table
