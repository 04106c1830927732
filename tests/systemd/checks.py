"""The end-to-end checks of `make test-systemd`, run by tests/systemd/vm.sh in its Debian 12 or
13 VM, as root, under a systemd that is PID 1:

    python3 checks.py DEBS_DIR

DEBS_DIR holds new/ (the .debs of the tree) and prev/ (the previous build, its version
lowered so that new/ is an upgrade over it). Each check prints one line, `PASS name (what
was seen)` or `FAIL name: what was seen instead`, and the last line is `checks done`; vm.sh
counts them. The checks run in the order a host lives through: the package installed and
upgraded, the sources, a reap of each kind for root and two users, a user's watchdogs and
lease (alive.py), the unit's life (reload, restart, stop, SIGKILL, the watchdog),
exitwatch-adopt and docs/adopt.md's three recipes as written, that no agent died of a
signal the checks did not mean (the journal), then the package removed and purged. A failed
check is reported and the next ones run all the same, each from what is really there."""

from __future__ import annotations

import glob
import os
import re
import shutil
import sys
import time
import traceback

from alive import lease_case, spools, watchdog_case
from guest import (
    IMAGE,
    Failed,
    answers,
    callbacks,
    journal,
    journal_cursor,
    kill,
    main_pid,
    meant_death,
    out,
    read,
    running,
    sh,
    spawn,
    status,
    unit,
    unmeant_deaths,
    wait_file,
    within,
)
from kinds import owner_case, run_case
from recipes import ADOPT, adopt_crash, adopt_restart, adopt_socket, recipe1, recipe2, recipe3

CONFIG = "/etc/exitwatch/config.toml"
# An operator's edit: the conffile's commented default uncommented, with another value, in
# its place (whatever table the file has it in).
DEFAULT = re.compile(r"^#\s*reconcile_interval\s*=.*$", re.M)
EDIT = "reconcile_interval = 300.0  # rig: an operator's edit, kept across upgrades"
COUNTS = {"PASS": 0, "FAIL": 0}


def check(name: str, fn, *args) -> object:
    """Runs one check: PASS with what it returned, or FAIL with why. Never raises."""
    start = time.monotonic()
    try:
        note = fn(*args)
    except Failed as err:
        verdict, detail = "FAIL", f": {err}"
        note = None
    except Exception as err:  # a bug of the check itself is a failure too, and says where
        verdict = "FAIL"
        where = traceback.extract_tb(err.__traceback__)[-1]
        detail = f": {type(err).__name__}: {err} (checks, line {where.lineno})"
        note = None
    else:
        verdict = "PASS"
        detail = f" ({note})" if isinstance(note, str) and note else ""
    took = time.monotonic() - start
    print(f"{verdict} {name}{detail} [{took:.1f} s]", flush=True)
    COUNTS[verdict] += 1
    return note


def info(text: str) -> None:
    print(f"  info: {text}", flush=True)


# -- the test images ---------------------------------------------------------------------------


def images() -> str:
    """rig/busybox:1 (busybox) and rig/runner:1 (busybox and the docker CLI with the libraries
    it links), imported from the guest's own files: the guest has no registry to pull from."""
    within(120, lambda: sh("docker version", check=False).returncode == 0, "the engine answers")
    root = "/var/tmp/rig-image"
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(f"{root}/bin")
    shutil.copy("/bin/busybox", f"{root}/bin/busybox")
    for applet in ("sh", "sleep", "cat", "echo", "true", "id", "ls"):
        os.symlink("busybox", f"{root}/bin/{applet}")
    sh(f"tar -C {root} -c . | docker import -c 'CMD [\"/bin/sh\"]' - {IMAGE}")
    libs = [w for w in out("ldd /usr/bin/docker").split() if w.startswith("/")]
    sh(["cp", "--parents", "-L", "/usr/bin/docker", *libs, root])
    sh(f"tar -C {root} -c . | docker import -c 'CMD [\"/bin/sh\"]' - rig/runner:1")
    shutil.rmtree(root)
    return out("docker version --format '{{.Server.Version}}'")


# -- the package: install, upgrade -------------------------------------------------------------


def version(package: str) -> str:
    return out(["dpkg-query", "-W", "-f=${Status} ${Version}", package], check=False)


def deb_version(path: str) -> str:
    return out(["dpkg-deb", "-f", path, "Version"])


def apt_install(*debs: str) -> None:
    sh(
        ["apt-get", "install", "-y", "-q", "-o", "Dpkg::Options::=--force-confold", *debs],
        env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"),
    )


def install_prev(debs: str) -> str:
    deb = glob.glob(f"{debs}/prev/exitwatch_*_all.deb")[0]
    apt_install(deb)
    want = deb_version(deb)
    if version("exitwatch") != f"install ok installed {want}":
        raise Failed(f"dpkg says {version('exitwatch')!r}, not {want}")
    within(60, running, "exitwatch.service running")
    within(60, answers, "the agent answers on its status socket")
    enabled = out("systemctl is-enabled exitwatch", check=False)
    if enabled != "enabled":
        raise Failed(f"exitwatch.service is {enabled}, not enabled")
    return f"{want}, enabled and running"


def before_upgrade() -> str:
    """An operator's edit of the conffile and a user's hook waiting in the spool."""
    text = read(CONFIG)
    if not DEFAULT.search(text):
        raise Failed("no '#reconcile_interval = ...' line in the conffile to edit")
    with open(CONFIG, "w") as f:
        f.write(DEFAULT.sub(EDIT, text, count=1) + "\n")
    d = "/tmp/rig-upgrade"
    os.makedirs(d, exist_ok=True)
    shutil.chown(d, "alice", "alice")
    proc = spawn(
        f"exec 2>{d}/log; cd {d}; exitwatch on-death -- "
        f"/bin/sh -c 'id -un >{d}/.ran && mv {d}/.ran {d}/hook-ran' "
        f">{d}/hook-id && touch {d}/ready && exec sleep 100000",
        user="alice",
    )
    wait_file(f"{d}/ready", 60)
    STATE["upgrade_owner"] = proc.pid
    STATE["spool"] = sorted(spool_files())
    if not STATE["spool"]:
        raise Failed("no file in /var/spool/exitwatch after alice's on-death")
    return f"{len(STATE['spool'])} spool file(s), config edited"


def spool_files() -> list[str]:
    found = []
    for top, _dirs, files in os.walk("/var/spool/exitwatch"):
        found += [os.path.join(top, f) for f in files]
    return found


def upgrade(debs: str) -> str:
    deb = glob.glob(f"{debs}/new/exitwatch_*_all.deb")[0]
    pid = main_pid()
    STATE["tree_cursor"] = journal_cursor()  # the tree's build from here on (no_crash)
    apt_install(deb)
    want = deb_version(deb)
    problems = []
    if version("exitwatch") != f"install ok installed {want}":
        problems.append(f"dpkg says {version('exitwatch')!r}")
    if EDIT not in read(CONFIG):
        problems.append("the edit of config.toml is gone")
    if os.path.exists(CONFIG + ".dpkg-new"):
        problems.append("config.toml.dpkg-new was left")
    missing = set(STATE["spool"]) - set(spool_files())
    if missing:
        problems.append(f"spool files gone: {sorted(missing)}")
    if problems:
        raise Failed("; ".join(problems))
    within(60, lambda: running() and main_pid() != pid, "the agent restarted on the new code")
    within(60, answers, "the agent answers")
    interval = status()["reconcile"]["interval_s"]
    if interval != 300.0:
        raise Failed(f"the agent's reconcile interval is {interval}, not the edited 300")
    return f"{want}; config edit and {len(STATE['spool'])} spool file(s) kept, edit in effect"


def hook_after_upgrade() -> str:
    kill(STATE["upgrade_owner"], 9)
    took = within(30, lambda: os.path.exists("/tmp/rig-upgrade/hook-ran"), "the hook ran")
    who = wait_file("/tmp/rig-upgrade/hook-ran")
    if who != "alice":
        raise Failed(f"the hook ran as {who}")
    return f"ran as alice {took:.2f} s after its owner's SIGKILL"


# -- the sources -------------------------------------------------------------------------------


def source_is(want: str) -> str:
    agent = status()["agent"]
    if agent["source"] != want:
        raise Failed(f"source {agent['source']} ({agent['source_reason']})")
    return agent["source_reason"]


def install_bpf(debs: str) -> str:
    deb = glob.glob(f"{debs}/new/exitwatch-bpf_*.deb")[0]
    pid = main_pid()
    apt_install(deb)
    within(60, lambda: running() and main_pid() != pid, "the agent restarted")
    within(60, answers, "the agent answers")
    return source_is("ebpf")


def status_cli() -> str:
    text = out("exitwatch status")
    if "source:   ebpf" not in text or "connected" not in text:
        raise Failed("unexpected: " + " | ".join(text.splitlines()[:4]))
    return " | ".join(line.strip() for line in text.splitlines()[1:3])


# -- the unit's life ---------------------------------------------------------------------------


def steady(seconds: float, bad) -> None:
    """bad() stays None for `seconds` (a state that must hold, not a wait for an event)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        why = bad()
        if why:
            raise Failed(why)
        time.sleep(0.2)


def systemd_lines(cursor: str, unit_name: str = "exitwatch") -> str:
    lines = journal(cursor, unit_name).splitlines()
    return " | ".join(lines[-4:])


def reload() -> str:
    pid = main_pid()
    cursor = journal_cursor()
    sh("systemctl reload exitwatch")

    def bad() -> str | None:
        u = unit("exitwatch", "ActiveState", "SubState", "MainPID")
        if int(u["MainPID"]) != pid:
            return f"MainPID {pid} became {u['MainPID']}: {systemd_lines(cursor)}"
        if u["ActiveState"] not in ("active", "reloading"):
            return f"unit {u['ActiveState']}/{u['SubState']}: {systemd_lines(cursor)}"
        return None

    within(30, lambda: "config reloaded" in journal(cursor), "'config reloaded'", fail_fast=bad)
    # systemd ends a unit stuck stopping after TimeoutStopSec=10s: watch past it.
    steady(12, bad)
    if not running() or not answers():
        raise Failed("not running or not answering after the reload")
    return f"MainPID {pid} kept, active/running 12 s on"


def restart() -> str:
    pid = main_pid()
    sh("systemctl restart exitwatch")
    within(60, lambda: running() and main_pid() not in (0, pid), "running with a new MainPID")
    within(60, answers, "the agent answers")
    return f"MainPID {pid} -> {main_pid()}"


def stop_start() -> str:
    pid = main_pid()
    cursor = journal_cursor()
    sh("systemctl stop exitwatch")
    u = unit("exitwatch", "ActiveState", "Result", "ExecMainStatus")
    if u["ActiveState"] != "inactive" or u["Result"] != "success":
        raise Failed(f"after stop: {u}: {systemd_lines(cursor)}")
    if os.path.exists(f"/proc/{pid}") or answers():
        raise Failed("the agent still runs or answers")
    if "exitwatch stopped" not in journal(cursor):
        raise Failed(f"no 'exitwatch stopped' in its log: {systemd_lines(cursor)}")
    sh("systemctl start exitwatch")
    within(60, lambda: running() and answers(), "running and answering again")
    return f"stopped cleanly (exit status {u['ExecMainStatus']}), started again"


def sigkill() -> str:
    pid = main_pid()
    before = int(unit("exitwatch", "NRestarts")["NRestarts"])
    meant_death("exitwatch.service", "KILL")
    kill(pid, 9)
    took = within(
        60,
        lambda: running() and main_pid() not in (0, pid) and answers(),
        "restarted by Restart=always and answering",
    )
    after = int(unit("exitwatch", "NRestarts")["NRestarts"])
    if after != before + 1:
        raise Failed(f"NRestarts {before} -> {after}")
    return f"back in {took:.1f} s, NRestarts {before} -> {after}"


def watchdog() -> str:
    """WatchdogSec=10s: a live agent pings it (no timeout so far, minutes into the boot),
    and a stopped one is killed and started again."""
    if unit("exitwatch", "WatchdogUSec")["WatchdogUSec"] in ("0", "infinity", ""):
        raise Failed("no WatchdogSec= on the unit")
    if "Watchdog timeout" in journal():
        raise Failed("a watchdog timeout already happened in this boot")
    pid = main_pid()
    cursor = journal_cursor()
    meant_death("exitwatch.service", "ABRT")  # systemd's, at the watchdog timeout
    kill(pid, 19)  # SIGSTOP: the loop sends no WATCHDOG=1 any more
    took = within(
        90,
        lambda: "Watchdog timeout" in journal(cursor) and running() and main_pid() != pid,
        "a watchdog timeout and a new MainPID",
    )
    within(60, answers, "the agent answers")
    return f"a stopped agent was restarted {took:.1f} s after SIGSTOP"


def no_crash() -> str:
    """The tree's agents, from the upgrade on, died of no signal but those the checks meant.
    A crash is restarted by Restart=always and the checks after it pass all the same, so the
    journal alone shows it: the agent's SIGABRT 0.1 s after its source started, now and then
    (a double free of a ctypes callback, docs/changes.md), passed every other check."""
    problems, seen = unmeant_deaths(STATE.get("tree_cursor", ""), ("exitwatch.service", ADOPT))
    if problems:
        raise Failed("; ".join(problems))
    return "deaths by signal, all meant: " + ", ".join(seen)


# -- the package: remove, purge ----------------------------------------------------------------


def agent_processes() -> list[str]:
    return out("pgrep -a -f '^/usr/bin/python3 /usr/bin/exitwatch'", check=False).splitlines()


def remove() -> str:
    sh("apt-get remove -y -q exitwatch exitwatch-bpf")
    problems = []
    if not version("exitwatch").startswith("deinstall ok config-files"):
        problems.append(f"dpkg says {version('exitwatch')!r}")
    if agent_processes():
        problems.append(f"still running: {agent_processes()}")
    for name in ("exitwatch.service", "exitwatch-adopt.service", "exitwatch-adopt.socket"):
        state = unit(name, "ActiveState")["ActiveState"]
        if state not in ("inactive", "failed"):
            problems.append(f"{name} is {state}")
    if not os.path.exists(CONFIG) or EDIT not in read(CONFIG):
        problems.append("config.toml or its edit is gone after a remove")
    if problems:
        raise Failed("; ".join(problems))
    return "nothing runs, config.toml kept"


def purge() -> str:
    sh("apt-get purge -y -q exitwatch exitwatch-bpf")
    left = [
        p
        for p in ("/etc/exitwatch", "/var/lib/exitwatch", "/var/spool/exitwatch")
        if os.path.exists(p)
    ]
    running_now = agent_processes()
    if left or running_now or version("exitwatch").startswith("install"):
        raise Failed(f"left: {left}; running: {running_now}; dpkg: {version('exitwatch')!r}")
    return "/etc/exitwatch, /var/lib/exitwatch, /var/spool/exitwatch gone"


STATE: dict = {}


def main() -> int:
    debs = sys.argv[1]
    print(f"  info: {out('uname -r')}, {out('systemctl --version').splitlines()[0]}", flush=True)
    check("the engine runs; test images imported", images)
    check("install the previous build", install_prev, debs)
    check("an edited config.toml and a hook in the spool", before_upgrade)
    check("upgrade to the tree's build keeps config and spool", upgrade, debs)
    check("a hook registered before the upgrade runs after it", hook_after_upgrade)
    check("the spools of hooks, leases and watchdogs: root's, 1733", spools)
    check("the source without exitwatch-bpf is netlink", source_is, "netlink")
    owner_case(check, "root", "netlink")
    check("installing exitwatch-bpf restarts the agent onto ebpf", install_bpf, debs)
    info(f"the agent's ctypes callbacks: {callbacks()}")
    check("exitwatch status (the CLI)", status_cli)
    for who in ("root", "alice", "bob"):
        owner_case(check, who, "ebpf")
        run_case(check, who)
    watchdog_case(check, "alice")
    lease_case(check, "alice")
    check("systemctl reload exitwatch keeps MainPID and the unit active", reload)
    check("systemctl restart exitwatch", restart)
    check("systemctl stop, then start", stop_start)
    check("SIGKILL of the main pid: Restart=always", sigkill)
    check("the watchdog", watchdog)
    check("exitwatch-adopt.socket activation", adopt_socket)
    check("exitwatch-adopt: SIGKILL, Restart=always, the same socket serves", adopt_crash)
    check("exitwatch-adopt: systemctl restart, the same socket serves", adopt_restart)
    recipe1(check)
    recipe2(check)
    recipe3(check)
    check("no agent died of a signal no check sent it", no_crash)
    check("apt-get remove", remove)
    check("apt-get purge", purge)
    print("checks done", flush=True)
    info(f"{COUNTS['PASS']} passed, {COUNTS['FAIL']} failed in the guest")
    return 1 if COUNTS["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())
