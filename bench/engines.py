"""8. Several engines: the reap latency on a private rootful podman and on a user's rootless
podman, each over that engine's own forced removal (as section 1 does on Docker); and the
idle cost of one agent following N private podmans against one following one of them, the
two taking turns within each trial."""

from __future__ import annotations

import os
import pwd
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bench import idle, latency, stats
from bench.engine import ROOTLESS_SH, Engine
from bench.procs import Agent, Runner, end_owners, spawn_owners

SOURCE = "netlink"  # the source every test host has; section 1 compares the sources
RUNNING = 4  # running containers per trial of latency.run with noise: ours and three floors
KEYS = "/proc/sys/kernel/keys/"
KEY_BYTES = 200  # quota bytes per key: runc's session keyring is named "_ses." + the id


@contextmanager
def key_quota(keys: int) -> Iterator[None]:
    """At least `keys` keys for each user (and bytes for them) while in it; the old quota
    after. runc gives every container a session keyring, charged to the engine's user: a
    user's default quota (kernel.keys.maxkeys 200, maxbytes 20000) holds fewer than the
    trials' running containers, and the next start fails with EDQUOT."""
    old = {name: Path(KEYS, name).read_text().strip() for name in ("maxkeys", "maxbytes")}
    want = {"maxkeys": keys + 100, "maxbytes": (keys + 100) * KEY_BYTES}
    for name, value in want.items():
        if value > int(old[name]):
            Path(KEYS, name).write_text(f"{value}\n")
    try:
        yield
    finally:
        for name, value in old.items():
            Path(KEYS, name).write_text(f"{value}\n")


@contextmanager
def podmans(base: str, count: int) -> Iterator[list[Engine]]:
    """`count` private rootful podmans, in BASE-p0, BASE-p1, ...; purged afterwards, with
    their network namespaces and what their containers mounted (a stopped podman's
    containers outlive it)."""
    engines: list[Engine] = []
    try:
        for i in range(count):
            engines.append(Engine(f"{base}-p{i}", "podman"))
        yield engines
    finally:
        for e in engines:
            e.close(purge=True)


@contextmanager
def rootless_podman(base: str) -> Iterator[Engine]:
    """A user of the bench's own (no login, a home below BASE-rl, subordinate ids) and its
    rootless podman, started as the user at /run/user/UID as on a bench host
    (tests/support/rootless.sh); afterwards the engine is purged and the user deleted."""
    d = f"{base}-rl"
    purge_user(d)  # what a run that was killed left
    os.makedirs(d, 0o755)
    name = f"ewbench{os.getpid()}"
    Path(d, "user").write_text(f"{name}\n")
    for ids in ("/etc/subuid", "/etc/subgid"):  # useradd gives ranges only where they exist
        Path(ids).touch(mode=0o644, exist_ok=True)
    argv = ["useradd", "--home-dir", f"{d}/home", "--no-create-home"]
    argv += ["--shell", "/usr/sbin/nologin", "--user-group", name]
    subprocess.run(argv, check=True, capture_output=True)
    try:
        pw = pwd.getpwnam(name)
        os.mkdir(pw.pw_dir, 0o700)
        os.chown(pw.pw_dir, pw.pw_uid, pw.pw_gid)
        engine = Engine(d, "podman", user=name)
        try:
            yield engine
        finally:
            engine.api.close()
    finally:
        purge_user(d)


def purge_user(d: str) -> None:
    """Purge the engines of the user named in D/user, delete the user, remove D."""
    user = Path(d, "user")
    if user.is_file():
        name = user.read_text().strip()
        subprocess.run([str(ROOTLESS_SH), "purge", name, d], capture_output=True, check=False)
        subprocess.run(["userdel", "--force", name], capture_output=True, check=False)
    subprocess.run(["rm", "-rf", "--one-file-system", d], check=False)


def run(
    base: str,
    work: str,
    trials: int,
    count: int,
    owners: int,
    per_owner: int,
    seconds: float,
    runs: int,
) -> dict:
    """`base`: the prefix of the podmans' directories (kept short: socket paths live under
    them); `work`: an empty directory of this run's."""
    roots = {}
    for name in ("rootful", "rootless", "empty"):
        roots[name] = os.path.join(work, name)
        os.makedirs(roots[name])
    with podmans(base, count) as engines:
        first = engines[0]
        out: dict = {"podman": first.version, "engines": count, "source": SOURCE}
        # The agent follows the podman it is given and nothing else: a user's rootless
        # engine that another program started on this host is not part of the figure.
        out["rootful_podman"] = latency.run(
            first, SOURCE, trials, roots["rootful"], 0.0, find_engines=False, noise=True
        )
        # What fails of the user's engine is said in its place; the rest still stands.
        try:
            with rootless_podman(base) as user_podman, key_quota(RUNNING * trials):
                out["rootless_podman"] = {"podman": user_podman.version} | latency.run(
                    user_podman,
                    SOURCE,
                    trials,
                    roots["rootless"],
                    0.0,
                    find_engines=False,
                    noise=True,
                )
        except Exception as err:
            out["rootless_podman"] = {"unavailable": f"{type(err).__name__}: {err}"}
        living = spawn_owners(owners)
        try:
            out["idle"] = _idle(engines, living, per_owner, seconds, runs, roots["empty"])
        finally:
            end_owners(living)
            for e in engines:
                e.clean()
    return out


def _idle(
    engines: list[Engine],
    owners: list[Runner],
    per_owner: int,
    seconds: float,
    runs: int,
    root: str,
) -> dict:
    """Every engine holds `per_owner` created containers of each live owner. Each trial runs
    the agent following all the engines and the one following the first, in turns (who goes
    first alternates), and takes the ratio of the two."""
    for e in engines:
        e.create_for([o.owner for o in owners], per_owner)
    hosts = tuple(e.host for e in engines)
    follows = {"all": hosts, "one": hosts[:1]}
    figures: dict[str, list[dict]] = {"all": [], "one": []}
    for i in range(runs):
        for name in ("all", "one") if i % 2 == 0 else ("one", "all"):
            agent = Agent("auto", hosts[0], [root], engines=follows[name], find_engines=False)
            with agent:
                figures[name].append(idle.measure(agent, seconds))
    out: dict = {
        "owners": len(owners),
        "containers_per_engine": len(owners) * per_owner,
        "runs": runs,
        **{name: figures[name] for name in ("all", "one")},
    }
    for key in ("cpu_pct", "rss_mb"):
        ratios = [
            stats.ratio(a[key], b[key]) for a, b in zip(figures["all"], figures["one"], strict=True)
        ]
        out[f"{key}_ratios"] = ratios
        # A trial whose one-engine agent used no measurable CPU (under a clock tick) has
        # no ratio; the median is of the others, None when there are none.
        measured = [r for r in ratios if r is not None]
        out[f"{key}_ratio"] = stats.median(measured) if measured else None
    return out
