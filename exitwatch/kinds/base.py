"""What an owner can own, and the one interface each kind of resource implements."""

from __future__ import annotations

import abc
from collections.abc import Callable, Hashable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

from exitwatch.owner import Owner, death, elsewhere


class Unavailable(Exception):
    """What a kind lists from does not answer now (the engine): one line naming it. Proves
    nothing about what it holds."""


@dataclass(frozen=True)
class Resource:
    kind: str  # a ResourceKind's `kind`: "container", "workdir", "hook", "process"
    key: str  # container id, workdir path, hook file name, or "pid:starttime"
    owner: Owner
    name: str = ""  # for people: container name, the path again, "ID: COMMAND" of a hook,
    # or "process PID (comm)"
    group: str | None = None  # compose project, where there is one
    # What the owner is, for people, as the resource says (a label); by keyword alone, so
    # that subclasses' fields keep their places.
    owner_name: str = field(default="", kw_only=True)


@dataclass(frozen=True)
class Found:
    resource: Resource


@dataclass(frozen=True)
class Gone:
    kind: str
    key: str


@dataclass(frozen=True)
class Snapshot:
    """The complete current set of one kind's resources (at start, after a reconnect), or
    of some scopes of it: a kind that lists from several places (the container kind, from
    each engine) tells of each on its own, and what one place's listing leaves out proves
    nothing about another's."""

    kind: str
    resources: tuple[Resource, ...]
    skipped: int = 0  # what the scan warned of, malformed or in doubt (the workdir kind)
    # The key prefixes it is the whole truth of; None: the whole kind.
    scopes: tuple[str, ...] | None = None

    def covers(self, key: str) -> bool:
        """Whether the resource keyed `key` is within what this listing is the truth of."""
        return self.scopes is None or key.startswith(self.scopes)


@dataclass(frozen=True)
class Acted:
    """What a kind did on its own to a live owner (its watchdog ended it): recorded as a
    removal is (a log line, an audit line, status's recent list), changing nothing in the
    index. `why` stands where a removal has how the owner died."""

    owner: Owner
    why: str
    outcome: Outcome


Change = Found | Gone | Snapshot | Acted
Notify = Callable[[Change], None]


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """The result of removing one resource (or one compose project). Built by keyword, or
    by one of the three constructors below, never from bare positional booleans."""

    what: str  # e.g. "container 3f2a… (web-1)", "workdir /tmp/x", "network p_default"
    kind: str
    ok: bool
    detail: str = ""  # "removed", "already gone", or why it failed or was refused
    refused: bool = False  # a safety check left it alone on purpose
    busy: bool = False  # not tried: another process is at it now (see ResourceKind.busy_wait)
    extra: dict = field(default_factory=dict)  # written to the audit log
    counts: tuple[str, ...] = ()  # further counters it moves, e.g. "hook_runs"
    key: str = ""  # the Resource.key it is about, where it is about exactly one

    @classmethod
    def done(cls, what: str, kind: str, detail: str = "removed", **more: Any) -> Outcome:
        """It is gone: removed, found gone already, or (in a dry run) would be removed."""
        return cls(what=what, kind=kind, ok=True, detail=detail, **more)

    @classmethod
    def failed(cls, what: str, kind: str, detail: str, **more: Any) -> Outcome:
        """It could not be removed now; the removal is tried again."""
        return cls(what=what, kind=kind, ok=False, detail=detail, **more)

    @classmethod
    def refusal(cls, what: str, kind: str, why: str, **more: Any) -> Outcome:
        """A safety check leaves it alone on purpose; it is not tried again until it is
        seen again (a reconcile, a change)."""
        return cls(what=what, kind=kind, ok=False, detail=why, refused=True, **more)

    @classmethod
    def later(cls, what: str, kind: str, why: str, **more: Any) -> Outcome:
        """It was not tried: another process is at it now (holds its lock). It is tried
        again after a pause, without spending an attempt, for up to the kind's
        `busy_wait`."""
        return cls(what=what, kind=kind, ok=False, detail=why, busy=True, **more)


class ResourceKind(abc.ABC):
    """One kind of resource: list it, watch it for changes, remove it."""

    kind: str  # the kind's KIND: "container", "workdir", "hook", "process"
    # Where its removals run: None for the agent's shared pool. A kind whose removals may
    # take long (a hook runs up to its timeout) brings its own, so they hold up no other.
    executor: Executor | None = None
    # Whether a removal under way for long says something is wrong (a hung engine, a frozen
    # filesystem): the oldest-pending alert watches for it. A hook may rightly run for an
    # hour, or wait for a runner's lock.
    ages_pending: bool = True
    # Lanes: a kind may bound how many of its removals run at once per lane (the hook kind:
    # per user, the lane being the uid). Its resources are then removed one per job, and a
    # job whose lane is full waits in the agent's queue, as data: it holds no worker.
    lane_limit: int = 0  # 0: no lanes, one job per dead owner
    # How long a resource may stay busy (Outcome.later) before that counts as a failed
    # attempt: the longest another process may rightly hold it.
    busy_wait: float = 0.0
    # Set by the service for a dry run: a kind that acts on live owners on its own (the
    # watchdog) then says what it would do, and does nothing.
    dry_run: bool = False

    @abc.abstractmethod
    def scan(self) -> Snapshot:
        """List every resource of this kind now; malformed ones are logged and skipped."""

    @abc.abstractmethod
    def start(self, notify: Notify) -> None:
        """Spawn a thread that reports a Snapshot first, then Found/Gone changes."""

    def reap(
        self, owner: Owner, resources: list[Resource], dry_run: bool, how: str = ""
    ) -> list[Outcome]:
        """Remove what the dead `owner` had, `how` it died (default: as /proc says now).

        The agent judged the owner on its own thread a moment ago: nothing is removed on a
        verdict that is not this one's, so every kind's removal starts with this check. A
        check that cannot be made fails the attempt (one line, tried again), never raises.
        Another machine's owner is never this agent's to judge, dead or alive.
        """
        try:
            away = elsewhere(owner)
            why = death(owner) if away is None else None
        except OSError as err:  # /proc unreadable now (EMFILE, ENOMEM): proves nothing
            cannot = f"cannot tell whether its owner {owner} lives: {err.strerror or err}"
            return [Outcome.failed(self.what(r), self.kind, cannot, key=r.key) for r in resources]
        if away is not None:
            return [self.refused(r, f"its owner {owner} is {away}") for r in resources]
        if why is None:
            return [self.refused(r, f"its owner {owner} is alive") for r in resources]
        return self.remove(owner, resources, dry_run, how or why)

    @abc.abstractmethod
    def remove(
        self, owner: Owner, resources: list[Resource], dry_run: bool, how: str
    ) -> list[Outcome]:
        """Remove what `owner` held once its run is over: reap() calls it when the owner is
        proven dead, `exitwatch run` (the owner itself) when its command and all its
        descendants are. Idempotent: already gone counts as done.

        Check again just before each destructive step; never raise for one resource's
        failure, report it in its Outcome.
        """

    def overdue(self, res: Resource) -> bool:
        """Whether this kind's watcher should have reported `res` by now. A reconcile that
        lists a resource the index does not hold counts it as missed only then: a kind
        whose watcher polls tells of a new resource at its next pass, not at once."""
        return True

    def lane(self, res: Resource) -> Hashable:
        """The lane of `res`, where `lane_limit` is set."""
        return None

    def what(self, res: Resource) -> str:
        """One resource, for people: "workdir /tmp/x", "hook 3f2a…: curl …"."""
        return f"{self.kind} {res.name or res.key}"

    def refused(self, res: Resource, why: str) -> Outcome:
        """The refusal of one resource, left alone on purpose."""
        return Outcome.refusal(self.what(res), self.kind, why, key=res.key)

    @abc.abstractmethod
    def stop(self) -> None:
        """Stop the watching thread. Idempotent, returns promptly."""

    def health(self) -> Mapping[str, Any]:
        """What status shows about this kind's backend (e.g. the Docker endpoint): a typed
        dictionary of the kind's, which service/status/schema.py names."""
        return {}

    def scan_health(self, error: Unavailable | None) -> Mapping[str, Any]:
        """What a one-shot scan shows about this kind's backend, its scan() having raised
        `error` or not; {} for none."""
        return {}

    def ping(self) -> str | None:
        """None when what this kind lists from answers; else one line naming it and why
        not (`exitwatch reap` stops on it rather than find nothing)."""
        return None


def _names(held: list[Resource]) -> list:
    """An owner's resources of a kind, as status lists them by default: sorted names."""
    return sorted(r.name or r.key for r in held)


@dataclass(frozen=True)
class Metric:
    """A metric of one kind, read from its health() at each scrape. A kind that is off
    serves 0: a series that appears only once a kind is on reads "no data" to an alert."""

    name: str  # e.g. "exitwatch_engine_connected"
    help: str
    key: str  # the health() key: a number, or a bool that counts as 0 or 1
    counter: bool = False  # only ever grows (the name then ends in _total)
    # One series per entry of a list in health() rather than one: (the list's key, the
    # entry's key whose value labels the series, the label's name).
    each: tuple[str, str, str] | None = None


@dataclass(frozen=True, kw_only=True)
class Part:
    """Resources of one type of a kind whose resources are of several (the container kind's
    networks and volumes), shown under a key of their own in a live owner's entry of the
    status document, rather than under the kind's table."""

    key: str  # the entry's key: "volumes"
    has: Callable[[Resource], bool]  # whether a resource of the kind is of this type
    held: Callable[[list[Resource]], list]  # the entry's list of them
    held_lines: Callable[[list], list[str]]  # the text view's lines of that list


@dataclass(frozen=True, kw_only=True)
class Registration:
    """What a kind declares of itself, so that the service, the status document and its
    text, the metrics, `exitwatch reap` and the config file iterate the kinds rather than
    name them (kinds/registry.py lists them)."""

    kind: str  # the kind's KIND: "container"
    # Its settings table in the config file ([containers]), and the key of what a live
    # owner holds of it in the status document.
    table: str
    # Its settings: a frozen dataclass whose first field is `enabled: bool = True`, with a
    # docstring per field (exitwatch.toml(5) shows them) and a checks() method giving
    # {field: (ok, what is expected)}.
    settings: type
    make: Callable[[Any], ResourceKind]  # the kind, from its settings
    # The flat keys of the file's top level that still set a field of the table, as they
    # did before the tables: {"workdir_roots": "roots"}. Each use is logged once with the
    # new spelling.
    aliases: Mapping[str, str] = field(default_factory=dict)
    # The status document's key of its health(), None when it shows none ("docker": the
    # name operators know the engine's line by).
    health_key: str | None = None
    # The lines of the text view that tell its health(), given that document.
    health_lines: Callable[[dict], list[str]] = lambda health: []
    # What a live owner holds of it, for the status document, and the text view's lines
    # of that.
    held: Callable[[list[Resource]], list] = _names
    held_lines: Callable[[list], list[str]] = lambda held: [f"    {h}" for h in held]
    # Counters that its removals move (Outcome.counts): name → help of the metric
    # exitwatch_NAME_total.
    counters: Mapping[str, str] = field(default_factory=dict)
    metrics: tuple[Metric, ...] = ()  # read from its health()
    # Its resources of other types than the table's, each under a key of its own.
    parts: tuple[Part, ...] = ()

    def entries(self, held: list[Resource]) -> dict[str, list]:
        """What a live owner holds of this kind, by its entry's keys: the table's, and each
        part's."""
        shown = {part.key: part.held([r for r in held if part.has(r)]) for part in self.parts}
        rest = [r for r in held if not any(part.has(r) for part in self.parts)]
        return {self.table: self.held(rest), **shown}

    def lines(self, entry: Mapping[str, Any]) -> list[str]:
        """The text view's lines of what a live owner's entry holds of this kind."""
        out = self.held_lines(entry.get(self.table, []))
        for part in self.parts:
            out += part.held_lines(entry.get(part.key, []))
        return out
