"""The Debian package, marked `deb`: the CI path: `make deb`, lintian, apt install, the
installed agent reaping a SIGKILLed owner on Debian's python3, then purge leaving nothing
behind. Its man page and conffile are checked against the code in
unit/test_manpage_and_conffile.py.

The `deb` tests install /usr/bin/exitwatch on this machine and purge it afterwards. They
run in one pass of `make test` (conftest.ONE_PASS): the installed package runs on
/usr/bin/python3 whichever interpreter runs pytest, and a second run would only rebuild and
reinstall the same package. Deselect them with `-m "not deb"`.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import stat
import subprocess
import tempfile
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from exitwatch.contract import HOOK_DIR

from support.agentproc import quiet_config
from support.packaging import DEBIAN_ENV, PAGES, bounding_set, man
from support.procs import kill, run, spawn_owner, wait_for

pytestmark = pytest.mark.deb  # the package's CI path

ROOT = Path(__file__).resolve().parents[2]
PACKAGING = ROOT / "packaging"
PACKAGES = ("exitwatch", "exitwatch-bpf")
# debhelper installs units in /lib/systemd/system on Debian 12 and in /usr/lib/systemd/system
# on 13; /usr is merged on both, so the second names the file on either.
SYSTEMD = ("/lib/systemd/system", "/usr/lib/systemd/system")
UNITS = tuple(f"{d}/exitwatch.service" for d in SYSTEMD)
UNIT = UNITS[1]
ADOPT_UNITS = tuple(f"{SYSTEMD[1]}/exitwatch-adopt.{ext}" for ext in ("socket", "service"))
# Keys the operations issue adds to Config; documented in the conffile already.


# -- the package, built, installed and purged ------------------------------------------------


def _version() -> str:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["version"]


def _apt(*args: str) -> None:
    run(
        ["apt-get", "-y", "-q", "-o", "DPkg::Lock::Timeout=120", *args],
        env=DEBIAN_ENV | {"DEBIAN_FRONTEND": "noninteractive"},
        timeout=300,
    )


def _purge() -> None:
    present = [p for p in PACKAGES if run(["dpkg", "-s", p], check=False).returncode == 0]
    if present:
        _apt("purge", *present)


@pytest.fixture(scope="module")
def debs() -> list[Path]:
    run(["make", "-C", str(ROOT), "deb"], timeout=900)
    version = _version()
    found = [
        *sorted((ROOT / "dist").glob(f"exitwatch_{version}_all.deb")),
        *sorted((ROOT / "dist").glob(f"exitwatch-bpf_{version}_*.deb")),
    ]
    assert len(found) == 2, f"make deb built {found}"
    return found


@pytest.fixture(scope="module")
def installed(debs: list[Path]) -> Iterator[dict[str, list[str]]]:
    """Install both packages; the paths each holds. Purged at the end whatever happens."""
    _purge()  # a run that died left it installed: start from nothing
    _apt("install", *(str(d) for d in debs))
    files = {p: run(["dpkg", "-L", p]).stdout.split("\n") for p in PACKAGES}
    try:
        yield {p: [f for f in paths if f and f != "/."] for p, paths in files.items()}
    finally:
        _purge()


def test_lintian_reports_no_errors_and_every_remaining_tag_is_explained(debs) -> None:
    changes = sorted((ROOT / "dist").glob(f"exitwatch_{_version()}_*.changes"))
    done = run(
        ["lintian", "--pedantic", "-I", "--show-overrides", *map(str, changes)],
        env=DEBIAN_ENV,
        check=False,
        timeout=300,
    )
    tags = re.findall(r"^([EWIPXO]): [^:]+: (\S+)", done.stdout, flags=re.M)
    assert not [t for t in tags if t[0] == "E"], done.stdout
    explained = (PACKAGING / "lintian.md").read_text()
    assert not [t for _, t in tags if t not in explained], done.stdout


def test_the_built_package_holds_every_man_page_and_each_renders(debs, tmp_path) -> None:
    main = next(d for d in debs if d.name.startswith("exitwatch_"))
    run(["dpkg-deb", "-x", str(main), str(tmp_path)])
    for name in PAGES:
        section = name.rsplit(".", 1)[1]
        page = tmp_path / "usr" / "share" / "man" / f"man{section}" / f"{name}.gz"
        assert page.is_file(), f"{name} is not in {main.name}"
        assert re.search(rf"^ +{re.escape(name.rsplit('.', 1)[0])} +- ", man(page), re.M)


def test_installed_exitwatch_runs_on_debians_python(installed) -> None:
    done = run(["/usr/bin/exitwatch", "--version"], env=DEBIAN_ENV, cwd=Path("/"))
    assert done.stdout.strip() == f"exitwatch, version {_version()}"
    # dh-python writes "#!/usr/bin/python3" on Debian 12, "#! /usr/bin/python3" on 13.
    shebang = Path("/usr/bin/exitwatch").read_text().splitlines()[0]
    assert re.fullmatch(r"#! ?/usr/bin/python3", shebang), shebang
    where = run(
        ["/usr/bin/python3", "-c", "import exitwatch; print(exitwatch.__file__)"],
        env=DEBIAN_ENV,
        cwd=Path("/"),
    ).stdout.strip()
    assert where == "/usr/lib/python3/dist-packages/exitwatch/__init__.py"
    bpf = "/usr/lib/python3/dist-packages/exitwatch/sources/exitwatch.bpf.o"
    assert bpf in installed["exitwatch-bpf"]


def test_installed_files_unit_conffile_and_man_page(installed) -> None:
    paths = installed["exitwatch"]
    for path in (
        "/usr/bin/exitwatch",
        "/etc/exitwatch/config.toml",
        "/usr/share/man/man8/exitwatch.8.gz",
        "/usr/share/man/man5/exitwatch.toml.5.gz",
        "/usr/share/man/man1/exitwatch-run.1.gz",
        "/usr/share/man/man8/exitwatch-adopt.8.gz",
        "/usr/share/man/man5/exitwatch-files.5.gz",
        "/var/lib/exitwatch",
        "/usr/share/exitwatch/prometheus/exitwatch.rules.yml",
        "/usr/share/exitwatch/grafana/exitwatch.json",
    ):
        assert path in paths
    assert any(unit in paths for unit in UNITS), "the unit is not in the package"
    # The rules as installed, with their unit tests beside them, still pass.
    tests = "/usr/share/exitwatch/prometheus/exitwatch.rules.test.yml"
    assert run(["promtool", "test", "rules", tests], env=DEBIAN_ENV, check=False).returncode == 0
    conffiles = run(["dpkg-query", "-W", "-f=${Conffiles}", "exitwatch"]).stdout
    assert "/etc/exitwatch/config.toml" in conffiles
    # Enabled on install, even where systemd is not running to start it.
    assert Path("/etc/systemd/system/multi-user.target.wants/exitwatch.service").is_symlink()
    for page in PAGES:
        name, section = page.rsplit(".", 1)
        found = run(["man", "-w", section, name], env=DEBIAN_ENV).stdout.strip()
        assert found == f"/usr/share/man/man{section}/{name}.{section}.gz"
    verify = run(["systemd-analyze", "verify", UNIT, *ADOPT_UNITS], env=DEBIAN_ENV, check=False)
    assert (verify.returncode, verify.stdout + verify.stderr) == (0, "")
    # exitwatch adopt's socket and service are shipped, and stay off until enabled.
    for unit in ADOPT_UNITS:
        assert any(f"{d}/{os.path.basename(unit)}" in paths for d in SYSTEMD), unit
    for wants in ("sockets.target.wants/exitwatch-adopt.socket", "exitwatch-adopt.service"):
        assert not Path(f"/etc/systemd/system/{wants}").exists()
    recorded = (PACKAGING / "security.md").read_text()
    for unit in (UNIT, ADOPT_UNITS[1]):
        security = run(
            ["systemd-analyze", "security", "--offline=true", unit], env=DEBIAN_ENV, check=False
        ).stdout
        name = os.path.basename(unit)
        score = re.search(rf"Overall exposure level for {name}: (\d+\.\d+)", security)
        assert score, security
        section = recorded.split(f"# {name}: systemd exposure score", 1)[1].split("\n# ")[0]
        assert f"**{score[1]}**" in section, f"packaging/security.md: {name} scores {score[1]}"


def test_the_postinst_makes_the_spool_where_there_is_no_systemd_tmpfiles(installed) -> None:
    """A minimal or container install has no systemd-tmpfiles to apply the package's
    tmpfiles.d entry, so the postinst makes the hook spool itself: root's, mode 1733."""
    spool = Path(HOOK_DIR)
    spool.rmdir()  # the package's own, empty
    postinst = "/var/lib/dpkg/info/exitwatch.postinst configure"
    # Hidden in a mount namespace of the script's own: dh_installtmpfiles' snippet runs it
    # only if `command -v` finds it executable.
    tmpfiles = shutil.which("systemd-tmpfiles", path=DEBIAN_ENV["PATH"])
    hide = f"mount --bind /dev/null {tmpfiles} && " if tmpfiles else ""
    run(["unshare", "--mount", "sh", "-c", hide + postinst], env=DEBIAN_ENV)
    st = spool.lstat()
    assert stat.S_ISDIR(st.st_mode), spool
    assert (oct(stat.S_IMODE(st.st_mode)), st.st_uid, st.st_gid) == (oct(0o1733), 0, 0)


def test_installed_agent_reaps_a_sigkilled_owner(installed, engine, tmp_path) -> None:
    """The installed CLI labels and marks; the installed agent, on Debian's python3 and held
    to the unit's capability bounding set, removes both once the owner is SIGKILLed."""
    root = Path(tempfile.mkdtemp(prefix="exitwatch-deb-"))
    log = tmp_path / "agent.log"
    owner = spawn_owner()
    agent = None
    try:
        labels = run(
            ["/usr/bin/exitwatch", "labels", "--pid", str(owner.pid), "--format", "docker-args"],
            env=DEBIAN_ENV,
        ).stdout.split()
        cid = engine.docker("run", "-d", *labels, engine.image).stdout.strip()
        workdir = root / "w"
        (workdir / "sub").mkdir(parents=True)
        (workdir / "sub" / "data").write_bytes(b"x" * 1000)
        run(["/usr/bin/exitwatch", "mark", str(workdir), "--pid", str(owner.pid)], env=DEBIAN_ENV)

        agent = subprocess.Popen(
            [
                "setpriv",
                f"--bounding-set={bounding_set(UNIT)}",
                "--inh-caps=-all",
                "/usr/bin/exitwatch",
                "agent",
                "--config",
                quiet_config(tmp_path),
                "--docker-host",
                engine.host,
                "--workdir-root",
                str(root),
                # Its own socket: an agent already running here must not make it refuse.
                "--status-socket",
                str(root / "status.sock"),
            ],
            env=DEBIAN_ENV,
            cwd="/",
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log.open("wb"),
        )

        def said(needle: str):
            def check() -> bool:
                if agent.poll() is not None:
                    raise AssertionError(f"agent exited {agent.returncode}:\n{log.read_text()}")
                return needle in log.read_text()

            return check

        wait_for(said("ready: watching 1 owners"), timeout=30, what="the agent to be ready")
        if Path("/sys/kernel/btf/vmlinux").exists():  # exitwatch-bpf's object, loaded
            assert "exit source ebpf" in log.read_text(), log.read_text()
        assert engine.docker("inspect", cid, check=False).returncode == 0
        assert workdir.exists()
        kill(owner, signal.SIGKILL)
        wait_for(
            lambda: engine.docker("inspect", cid, check=False).returncode != 0,
            what=f"container {cid[:12]} gone",
        )
        wait_for(lambda: not workdir.exists(), what=f"{workdir} gone")
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=30) == 0, log.read_text()
    finally:
        if agent is not None and agent.poll() is None:
            agent.kill()
            agent.wait()
        if owner.proc.poll() is None:
            kill(owner)
        subprocess.run(["rm", "-rf", "--one-file-system", str(root)], check=False)


def test_purge_leaves_nothing_behind(installed) -> None:
    # What the agent and an admin leave beside the packaged files goes too.
    Path("/var/lib/exitwatch/audit.jsonl").write_text("{}\n")
    Path("/etc/exitwatch/config.toml.dpkg-old").write_text("")
    _purge()
    for package in PACKAGES:
        assert run(["dpkg", "-s", package], check=False).returncode != 0, f"{package} not purged"
    left = []
    for path in sorted({p for paths in installed.values() for p in paths}):
        # Directories other packages hold too (/usr/bin, /lib/systemd/system...) stay.
        if os.path.lexists(path) and run(["dpkg", "-S", path], check=False).returncode != 0:
            left.append(path)
    for path in (
        "/etc/exitwatch",
        "/var/lib/exitwatch",
        "/etc/systemd/system/multi-user.target.wants/exitwatch.service",
        "/var/lib/systemd/deb-systemd-helper-enabled/exitwatch.service.daemon.dsh-also",
        "/var/lib/systemd/deb-systemd-helper-enabled/multi-user.target.wants/exitwatch.service",
        "/usr/lib/python3/dist-packages/exitwatch",
    ):
        if os.path.lexists(path):
            left.append(path)
    assert not left, f"left after purge: {left}"
