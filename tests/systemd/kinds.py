"""A reap of each kind under the installed unit, for root or an unprivileged user (checks.py):

- owner_case: a shell labels a container (`exitwatch labels`), marks a workdir (`exitwatch
  mark`) and leaves an on-death hook (`exitwatch on-death`), then becomes a `sleep` (exec
  keeps its pid and start time, so it stays the owner) and is SIGKILLed;
- run_case: `exitwatch run -- sh -c 'docker run ...; setsid sleep ... &; ...'` is SIGKILLed:
  its CMD dies with it, and what is left is a container made through the run's socket, its
  TMPDIR, and a leftover process, which must die within a second.

Each check waits for what it needs with a deadline; the owner is SIGKILLed whatever the
check before found, so each removal is judged on its own."""

from __future__ import annotations

import os
import shutil

from guest import (
    IMAGE,
    Failed,
    alive,
    container_exists,
    kill,
    owner_of,
    read,
    spawn,
    starttime,
    wait_file,
    watch,
    within,
)

LEFTOVER_DEADLINE = 1.0  # issue 27: a SIGKILLed run's leftovers die within a second
# A removal under software emulation: an engine's `docker rm` alone takes seconds there.
REAP_DEADLINE = 45.0


def scratch(who: str, what: str) -> str:
    d = f"/tmp/rig-{who}-{what}"
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    if who != "root":
        shutil.chown(d, who, who)
    return d


def ready(d: str) -> None:
    """Wait for the case's process in `d` to say it made what it makes; on failure, with
    its log."""
    try:
        wait_file(f"{d}/ready", 120)
    except Failed as err:
        raise Failed(f"{err}; its log: {log_tail(d)}") from None


def log_tail(d: str) -> str:
    try:
        return " | ".join(read(f"{d}/log").splitlines()[-3:])
    except OSError:
        return ""


def owner_case(check, who: str, source: str) -> None:
    tag = f"{who} ({source})"
    d = scratch(who, f"owner-{source}")
    proc = spawn(
        f"exec 2>{d}/log; set -e; cd {d}\n"
        f"docker run -d $(exitwatch labels --format docker-args) {IMAGE} sleep 100000 >cid\n"
        "mkdir w; echo data >w/data; exitwatch mark w\n"
        "exitwatch on-death -- "
        f"/bin/sh -c 'id -un >{d}/.ran && mv {d}/.ran {d}/hook-ran' >hook-id\n"
        "touch ready; exec sleep 100000",
        user=None if who == "root" else who,
    )
    pid = proc.pid
    state: dict = {}

    def watched() -> str:
        ready(d)
        state["cid"] = read(f"{d}/cid")

        def all_three() -> bool:
            o = owner_of(pid)
            return bool(o and o["containers"] and o["workdirs"] and o["hooks"])

        try:
            within(60, all_three, "the agent watches the owner's container, workdir and hook")
        except Failed as err:
            raise Failed(f"{err}; it shows {owner_of(pid)}") from None
        return f"owner pid {pid}"

    check(f"{tag}: an owner with a labelled container, a marked workdir and a hook", watched)
    kill(pid)
    proc.wait()
    took = watch(
        {
            "container": lambda: "cid" in state and not container_exists(state["cid"]),
            "workdir": lambda: not os.path.exists(f"{d}/w"),
            "hook": lambda: os.path.exists(f"{d}/hook-ran"),
        },
        REAP_DEADLINE,
    )

    def gone(what: str) -> str:
        if took[what] is None:
            raise Failed(f"not within {REAP_DEADLINE:g} s of the owner's SIGKILL")
        return f"{took[what]:.2f} s after SIGKILL"

    def hook_ran() -> str:
        note = gone("hook")
        ran = read(f"{d}/hook-ran")
        if ran != who:
            raise Failed(f"the hook ran as {ran!r}")
        return f"ran as {who}, {note}"

    check(f"{tag}: SIGKILLed owner's container removed", gone, "container")
    check(f"{tag}: SIGKILLed owner's workdir removed", gone, "workdir")
    check(f"{tag}: SIGKILLed owner's on-death hook ran as its user", hook_ran)


def run_case(check, who: str) -> None:
    d = scratch(who, "run")
    proc = spawn(
        f"exec 2>{d}/log; exec exitwatch run -- /bin/sh -c '"
        f"docker run -d {IMAGE} sleep 100000 >{d}/cid; "
        f"setsid sleep 100001 </dev/null >/dev/null 2>&1 & echo $! >{d}/leftover; "
        f'echo "$TMPDIR" >{d}/tmpdir; touch {d}/ready; exec sleep 100002\'',
        user=None if who == "root" else who,
    )
    wrapper = proc.pid
    state: dict = {}

    def started() -> str:
        ready(d)
        state["cid"] = read(f"{d}/cid")
        state["tmpdir"] = read(f"{d}/tmpdir")
        state["leftover"] = int(read(f"{d}/leftover"))
        state["start"] = starttime(state["leftover"])
        leftover = str(state["leftover"])

        def sees_all() -> bool:
            o = owner_of(wrapper)
            return bool(
                o
                and o["containers"]
                and any(p.startswith(f"process {leftover} (") for p in o["processes"])
            )

        try:
            within(30, sees_all, "the agent watches the run's container and leftover process")
        except Failed as err:
            raise Failed(f"{err}; it shows {owner_of(wrapper)}") from None
        return f"wrapper pid {wrapper}, leftover pid {leftover}"

    check(f"{who}: exitwatch run with a container and a setsid child; the agent sees both", started)
    kill(wrapper)
    proc.wait()
    pid, start = state.get("leftover"), state.get("start")
    took = watch(
        {
            "leftover": lambda: pid is not None and not alive(pid, start),
            "container": lambda: "cid" in state and not container_exists(state["cid"]),
            "tmpdir": lambda: bool(state.get("tmpdir")) and not os.path.exists(state["tmpdir"]),
        },
        REAP_DEADLINE,
        every=0.01,
    )
    if pid is not None and took["leftover"] is None:
        kill(pid)  # the next cases start clean

    def leftover_dies() -> str:
        if pid is None:
            raise Failed("the run did not start")
        if took["leftover"] is None:
            raise Failed(
                f"leftover {pid} still alive {REAP_DEADLINE:g} s after the wrapper's SIGKILL"
            )
        if took["leftover"] > LEFTOVER_DEADLINE:
            raise Failed(
                f"leftover {pid} died {took['leftover']:.2f} s after the wrapper's SIGKILL"
            )
        return f"died {took['leftover']:.2f} s after the wrapper's SIGKILL"

    def gone(what: str) -> str:
        if took[what] is None:
            raise Failed(f"not within {REAP_DEADLINE:g} s of the wrapper's SIGKILL")
        return f"{took[what]:.2f} s after SIGKILL"

    check(f"{who}: SIGKILLed run's leftover process dies within 1 s", leftover_dies)
    check(f"{who}: SIGKILLed run's container removed", gone, "container")
    check(f"{who}: SIGKILLed run's TMPDIR removed", gone, "tmpdir")
