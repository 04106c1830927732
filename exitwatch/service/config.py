"""The agent's settings: one frozen dataclass whose fields carry their defaults, and the
TOML file that sets them."""

from __future__ import annotations

import os
import tomllib
import types
import typing
from dataclasses import asdict, dataclass, fields, replace

from exitwatch.contract import HOOK_DIR
from exitwatch.sources import MODES

DEFAULT_PATH = "/etc/exitwatch/config.toml"
TABLE = "adopt"  # the one table of the file: Config.adopt


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
    "*/inspect eval *". The nearest matching process from the client up is the owner; in a
    container with no match, the container's init; on the host with no match, nobody."""


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
    workdir_roots: tuple[str, ...] = ("/tmp", "/var/tmp")
    """Directories under which marked workdirs are looked for."""
    workdir_depth: int = 3
    """How many levels below a root a workdir may be."""
    kill_leftovers: bool = True
    """Kill a dead `exitwatch run`'s leftover processes (EXITWATCH_OWNER and EXITWATCH_RUN
    in their environment)."""
    leftovers_interval: float = 1.0
    """Seconds between two listings of /proc for a dead run's leftover processes."""
    docker_host: str | None = None
    """Docker engine URL; unset: DOCKER_HOST, or the default socket."""
    reap_workers: int = 16
    """Removals run in parallel on this many threads."""
    engine_concurrency: int = 16
    """At most this many requests to the Docker engine are under way at once for removals
    (of containers, their networks and volumes, and the listings they need), over every
    removal of the process: a dead owner with 1,000 containers, or many dead owners at
    once, wait their turn rather than flood the engine."""
    reap_attempts: int = 3
    """A removal that fails is tried this many times in all, 0.5 s, 2 s, 8 s, ... apart: the
    agent's attempts. Within each, the container kind sends each engine call up to 3 times
    (0.2 s, then 0.4 s apart), so the engine may be asked 3 times reap_attempts; the log
    line of a failure says its tries, and the last one the attempts. `exitwatch reap` also
    judges an owner whose liveness cannot be read this many times, a second apart."""
    hook_dir: str = HOOK_DIR
    """The spool of on-death hooks (root's, mode 1733; the agent creates it)."""
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

    def describe(self) -> str:
        return " ".join(f"{k}={v!r}" for k, v in asdict(self).items())

    def validate(self) -> None:
        """Raise ConfigError(key: what is expected) for a value out of range."""
        checks = {
            "source": (self.source in MODES, f"one of {', '.join(MODES)}"),
            "poll_interval": (0.01 <= self.poll_interval <= 3600, "a number in 0.01..3600"),
            "workdir_roots": (
                all(r.startswith("/") for r in self.workdir_roots),
                "a list of absolute paths",
            ),
            "ebpf_max_owners": (1 <= self.ebpf_max_owners <= 1 << 24, "an integer in 1..16777216"),
            "workdir_depth": (1 <= self.workdir_depth <= 16, "an integer in 1..16"),
            "leftovers_interval": (
                0.1 <= self.leftovers_interval <= 3600,
                "a number in 0.1..3600",
            ),
            "reap_workers": (1 <= self.reap_workers <= 256, "an integer in 1..256"),
            "engine_concurrency": (
                1 <= self.engine_concurrency <= 256,
                "an integer in 1..256",
            ),
            "reap_attempts": (1 <= self.reap_attempts <= 10, "an integer in 1..10"),
            "reconcile_interval": (
                self.reconcile_interval == 0 or 1 <= self.reconcile_interval <= 86400,
                "0 (off) or a number in 1..86400",
            ),
            "docker_host": (
                self.docker_host is None or self.docker_host.startswith("unix://"),
                "a local engine's unix:// socket (owners are processes of this host)",
            ),
            "hook_dir": (self.hook_dir.startswith("/"), "an absolute path"),
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
        self._validate_adopt()

    def _validate_adopt(self) -> None:
        adopt = self.adopt
        checks = {
            "listen": (
                adopt.listen.startswith("/") and 0 < len(os.fsencode(adopt.listen)) < 108,
                "an absolute path of less than 108 bytes (a socket's address)",
            ),
            "docker_host": (
                adopt.docker_host is None or adopt.docker_host.startswith("unix://"),
                "a local engine's unix:// socket (owners are processes of this host)",
            ),
            "rules": (
                all(r.strip() and "\0" not in r for r in adopt.rules),
                "a list of non-empty fnmatch patterns",
            ),
        }
        for key, (ok, expected) in checks.items():
            if not ok:
                got = getattr(adopt, key)
                raise ConfigError(f"{TABLE}.{key}: expected {expected}, got {got!r}")


def parse_addr(addr: str) -> tuple[str, int] | None:
    """HOST:PORT (or [V6]:PORT) → (host, port), or None if malformed."""
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return host.strip("[]"), int(port)


_HINTS = {Config: typing.get_type_hints(Config), Adopt: typing.get_type_hints(Adopt)}
_NAMES = {
    "str": "a string",
    "bool": "true or false",
    "int": "an integer",
    "float": "a number",
    "tuple": "a list of strings",
}


def _coerce(key: str, value: object, of: type = Config, shown: str = "") -> object:
    """TOML value → field value of `of`, or ConfigError naming what the key expects."""
    hint = _HINTS[of][key]
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


def _table(value: object, base: Adopt) -> Adopt:
    """The `[adopt]` table over `base`."""
    if not isinstance(value, dict):
        raise ConfigError(f"{TABLE}: expected a table ([{TABLE}]), got {value!r}")
    known = {f.name for f in fields(Adopt)}
    values = {}
    for key, item in value.items():
        if key not in known:
            names = ", ".join(sorted(known))
            raise ConfigError(f"unknown key '{TABLE}.{key}' (known in [{TABLE}]: {names})")
        values[key] = _coerce(key, item, Adopt, f"{TABLE}.{key}")
    return replace(base, **values)


def _unreadable(err: OSError) -> str:
    """What to do about a config file that cannot be read."""
    if isinstance(err, FileNotFoundError):
        return " (give --config an existing file, or leave it out for the defaults)"
    if isinstance(err, PermissionError):
        return " (run as root, or make the file readable)"
    return ""


def load(path: str, base: Config | None = None) -> Config:
    """Read a TOML config file over `base` (default: the defaults)."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as err:
        raise ConfigError(f"{path}: cannot read: {err.strerror}{_unreadable(err)}") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: not valid TOML: {err}") from None
    base = base or Config()
    known = {f.name for f in fields(Config)} - {TABLE}
    values: dict[str, object] = {}
    try:
        for key, value in data.items():
            if key == TABLE:
                values[key] = _table(value, base.adopt)
                continue
            if key not in known:
                raise ConfigError(f"unknown key {key!r} (known: {', '.join(sorted(known))})")
            values[key] = _coerce(key, value)
        config = replace(base, **values)
        config.validate()
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None
    return config
