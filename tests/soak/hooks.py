"""Owners with on-death hooks: a process of an unprivileged user that registers its hooks with
`on_death` into the agent's spool and waits; SIGKILLed (the hooks must run, as that user),
or let go, when it cancels its hooks and exits (they must never run). One actor per user:
two users whose hooks succeed at once or fail their first run, and one whose many slow
hooks fill its lane, so that the others' start delays show whether they waited on it."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from exitwatch.contract import ENV_HOOK_DIR
from exitwatch.owner import owner_of

from . import hookruns
from .actor import Actor, Ground, Owned, View
from .report import spread
from support.users import SYSTEM_PYTHON, as_user
from support.wrapper import REPO

# Run as the user: registers one hook per (token, mode), tells their ids, waits for its
# stdin to close, then cancels them (a clean teardown) and exits.
_OWNER = """
import json, sys
sys.path.insert(0, sys.argv[1])
from exitwatch import cancel_hook, on_death
hook, env, specs = sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
ids = [on_death(["sh", "-c", hook, token, mode], env=env, timeout=60) for token, mode in specs]
print(json.dumps(ids), flush=True)
sys.stdin.read()
for hook_id in ids:
    cancel_hook(hook_id)
"""
# A fair user's hook starts this soon after its owner's death at the latest. A hook that
# waited for one of the slow user's would wait SLOW seconds at least.
START_BOUND = 2.5
SLOW = 5.0  # seconds a slow hook runs
# Hooks of one user at a time at most, as the README promises: a literal, since the agent's
# own constant would move with a change of the agent's.
PER_USER = 8


@dataclass(frozen=True)
class Profile:
    what: str  # for the table
    modes: tuple[str, ...]  # each hook's mode, chosen at random
    hooks: tuple[int, int]  # how many hooks an owner has, at least and at most
    cancel: float  # the share of owners that cancel their hooks and exit cleanly
    period: float
    live_target: int
    steady_count: int
    start_bound: float | None  # the latest a first run may start after the death


FAIR = Profile("some failing once", ("ok", "fail-once"), (1, 2), 0.2, 0.5, 6, 1, START_BOUND)
# 12 hooks of SLOW s every 11 s: its lane of PER_USER is full most of the time (12 take
# 7.5 s at the least), without falling behind.
SLOW_LANE = Profile("slow, filling its lane", ("slow",), (12, 12), 0.0, 11.0, 2, 0, None)


@dataclass(frozen=True)
class Hook:
    id: str
    token: str
    mode: str


@dataclass
class HookOwner(Owned):
    proc: subprocess.Popen | None = None
    hooks: list[Hook] = field(default_factory=list)


class HookOwners(Actor):
    def __init__(self, ground: Ground, user: pwd.struct_passwd, profile: Profile) -> None:
        super().__init__(ground)
        self.user, self.profile, self.spool = user, profile, ground.spool
        self.name = f"hooks of {user.pw_name}"
        self.period = profile.period
        self.live_target, self.steady_count = profile.live_target, profile.steady_count
        self.results = ground.results / user.pw_name
        self.results.mkdir(mode=0o700)
        os.chown(self.results, user.pw_uid, user.pw_gid)
        self.n = 0

    def _row(self, how: str) -> str:
        return f"hooks of {self.user.pw_name} ({self.profile.what}), {how}"

    def make(self, steady: bool) -> HookOwner:
        self.n += 1
        cancel = not steady and self.rng.random() < self.profile.cancel
        how = "steady" if steady else "cancelled, then exit" if cancel else "SIGKILLed"
        specs = [
            (f"{self.n}-{k}", self.rng.choice(self.profile.modes))
            for k in range(self.rng.randint(*self.profile.hooks))
        ]
        env = {"R": str(self.results), "SLOW": str(SLOW)}
        proc = as_user(
            self.user,
            f'cd /tmp && exec {SYSTEM_PYTHON} -I -S -c "$@"',
            _OWNER,
            str(REPO),
            hookruns.HOOK,
            json.dumps(env),
            json.dumps(specs),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={ENV_HOOK_DIR: str(self.spool), "PATH": "/usr/bin:/bin"},
        )
        assert proc.stdout is not None
        line = proc.stdout.readline()
        proc.stdout.close()
        if not line:
            proc.kill()
            proc.wait()
            raise RuntimeError(f"{self.name}: an owner could not register its hooks")
        ids = json.loads(line)
        owner = str(owner_of(proc.pid))  # setpriv and sh exec: the pid is the owner's
        return HookOwner(
            name=f"hook owner {owner} of {self.user.pw_name}",
            row=self._row(how),
            steady=steady,
            proc=proc,
            owner=owner,
            hooks=[Hook(i, token, mode) for i, (token, mode) in zip(ids, specs, strict=True)],
        )

    def end(self, owned: Owned) -> None:
        assert isinstance(owned, HookOwner) and owned.proc is not None
        assert owned.proc.stdin is not None
        owned.died = time.time()
        if owned.row.endswith("SIGKILLed"):
            owned.ended_by = "SIGKILL"
            owned.proc.kill()
        else:
            owned.ended_by = "cancelling its hooks and exiting"
            owned.proc.stdin.close()
        if owned.proc.wait(timeout=60) not in (0, -9):
            self.errors.append(f"{owned.name} exited {owned.proc.returncode}")

    def _has(self, hook: Hook) -> bool:
        """Whether the hook's directory is in the spool."""
        return (self.spool / hook.id).exists()

    def missing(self, owned: Owned, view: View) -> list[str]:
        assert isinstance(owned, HookOwner)
        out = [f"hook {h.id} is gone from the spool" for h in owned.hooks if not self._has(h)]
        # A live owner's hook that ran is a wrong removal too.
        return out + [f"hook {h.id} ran" for h in owned.hooks if (self.results / h.token).exists()]

    def remains(self, owned: Owned, view: View) -> list[str]:
        assert isinstance(owned, HookOwner)
        return [f"hook {h.id} in the spool" for h in owned.hooks if self._has(h)]

    def _judged(self) -> list[str]:
        out = []
        for owned in self.dead + self.steady:
            assert isinstance(owned, HookOwner)
            cancelled = owned.ended_by.startswith("cancelling")
            died = None if owned.steady else owned.died
            for h in owned.hooks:
                path = self.results / h.token
                for what in hookruns.judge(
                    path, h.mode, self.user.pw_uid, owned.owner, died, cancelled
                ):
                    out.append(f"hook {h.id} ({h.mode}) of {owned.name}: {what}")
        return out

    def _killed_hooks(self) -> list[tuple[HookOwner, Hook]]:
        return [
            (o, h)
            for o in self.dead
            if isinstance(o, HookOwner) and o.ended_by == "SIGKILL"
            for h in o.hooks
        ]

    def delays(self) -> list[float]:
        """Each killed owner's hook's first start after its owner's death, in seconds."""
        out = []
        for owned, h in self._killed_hooks():
            done = hookruns.runs(self.results / h.token)
            if done and owned.died is not None:
                out.append(done[0].start - owned.died)
        return out

    def at_once(self) -> int:
        """The most of this user's hooks that ran at one moment."""
        intervals = [
            (r.start, r.end)
            for _, h in self._killed_hooks()
            for r in hookruns.runs(self.results / h.token)
            if r.end is not None
        ]
        return hookruns.most_at_once(intervals)

    def contract(self, audit: Sequence[dict]) -> list[str]:
        out = self._judged()
        bound = self.profile.start_bound
        late = [d for d in self.delays() if bound is not None and d > bound]
        if late:
            out.append(
                f"{self.name}: {len(late)} hooks started more than {bound} s after their "
                f"owner's death (the latest {max(late):.3f} s): waited on another's?"
            )
        if (most := self.at_once()) > PER_USER:
            out.append(f"{self.name}: {most} hooks ran at once, more than {PER_USER}")
        return out

    def hook_runs(self, row: str) -> int | None:
        return sum(
            len(hookruns.runs(self.results / h.token))
            for o in self.dead + self.steady + self.live
            if isinstance(o, HookOwner) and o.row == row
            for h in o.hooks
        )

    def figures(self) -> dict:
        return {
            "user": self.user.pw_name,
            "start_delay": spread(self.delays()),
            "start_bound_s": self.profile.start_bound,
            "most_at_once": self.at_once(),
        }


def actors(ground: Ground) -> list[Actor]:
    """Every user but the last with fair hooks, the last with slow ones."""
    *fair, slow = ground.users
    return [HookOwners(ground, u, FAIR) for u in fair] + [HookOwners(ground, slow, SLOW_LANE)]
