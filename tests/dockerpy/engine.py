"""The private engine of the docker-py check (check.py): tests/support/engine.sh's
dockerd, the stand-in images docker-py's tests run, and what a path left on it.

Run by check.py on the project's python; imports nothing of exitwatch's.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from compare import LABEL, engine_time, made_during

ENGINE_SH = Path(__file__).resolve().parents[1] / "support" / "engine.sh"
BUILTIN_NETWORKS = {"bridge", "host", "none"}

# The images docker-py's tests run: stand-ins, Debian's busybox-static in a rootfs shaped
# like alpine's (stand_in_rootfs), `docker import`ed with the real ones' default command.
STAND_INS = ("busybox:latest", "alpine:latest", "alpine:3.10")


def run(argv: list[str], check: bool = True, **kw: object) -> subprocess.CompletedProcess[str]:
    kw.setdefault("capture_output", True)
    done = subprocess.run(argv, text=True, **kw)  # type: ignore[call-overload]
    if check and done.returncode != 0:
        sys.exit(f"dockerpy: {' '.join(argv)} exited {done.returncode}:\n{done.stderr}")
    return done


class Engine:
    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="exitwatch-dpy-", dir="/tmp"))
        self.socket = self.dir / "docker.sock"
        self.host = f"unix://{self.socket}"

    def docker(self, *args: str, **kw: object) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("DOCKER_")}
        return run(["docker", *args], env=env | {"DOCKER_HOST": self.host}, **kw)

    def start(self) -> None:
        run([str(ENGINE_SH), "start", str(self.dir), str(self.socket)])
        self.stand_ins()

    def purge(self) -> None:
        """Stop it and remove its directory, and the host bridges of its networks, which
        dockerd leaves behind when it stops (and a stale endpoint keeps a network)."""
        bridges = self.bridges()
        run([str(ENGINE_SH), "purge", str(self.dir)], check=False)
        for bridge in bridges:
            remove_bridge(bridge)

    def bridges(self) -> list[str]:
        """The host bridge of each of its bridge networks but the default."""
        got = self.docker("network", "ls", "-q", "--no-trunc", "--filter", "driver=bridge")
        found = []
        for ident in got.stdout.split():
            inspected = self.docker("network", "inspect", ident, check=False)
            if inspected.returncode != 0:
                continue
            (attrs,) = json.loads(inspected.stdout)
            if attrs["Name"] in BUILTIN_NETWORKS:
                continue
            options = attrs.get("Options") or {}
            found.append(options.get("com.docker.network.bridge.name") or f"br-{ident[:12]}")
        return found

    def api_version(self) -> str:
        return self.docker("version", "--format", "{{.Server.APIVersion}}").stdout.strip()

    def stand_ins(self) -> None:
        """Each image of STAND_INS, unless it is there: Debian's busybox-static in a rootfs
        shaped like alpine's (its directories, its users), `docker import`ed with the real
        images' default command (`sh`)."""
        have = set(self.docker("images", "--format", "{{.Repository}}:{{.Tag}}").stdout.split())
        missing = [name for name in STAND_INS if name not in have]
        if not missing:
            return
        rootfs = self.dir / "rootfs.tar"
        stand_in_rootfs(rootfs)
        try:
            for name in missing:
                self.docker(
                    "import", "--change", f"ENV PATH={STAND_IN_PATH}", "--change", 'CMD ["sh"]',
                    str(rootfs), name,
                )  # fmt: skip
        finally:
            rootfs.unlink()

    def snapshot(self) -> dict[str, set[str]]:
        return {
            "containers": set(self.docker("ps", "-aq", "--no-trunc").stdout.split()),
            "networks": set(self.docker("network", "ls", "-q", "--no-trunc").stdout.split()),
            "volumes": set(self.docker("volume", "ls", "-q").stdout.split()),
            "images": set(self.docker("images", "-aq", "--no-trunc").stdout.split()),
        }

    def left(self, before: dict[str, set[str]]) -> list[str]:
        """How many containers, networks and volumes were made since `before` and are
        still there, labelled or not."""
        now = self.snapshot()
        return [
            f"{len(now[kind] - before[kind])} {kind}"
            for kind in ("containers", "networks", "volumes")
            if now[kind] - before[kind]
        ]

    def unlabelled(
        self, before: dict[str, set[str]], ran: dict[str, tuple[float, float]]
    ) -> list[str]:
        """What was made since `before` and is still there without the owner label, each
        with the test that was running when it was made (`ran`: when each test ran)."""
        now = self.snapshot()
        found = []
        for kind, inspect in (
            ("containers", "container"),
            ("networks", "network"),
            ("volumes", "volume"),
        ):
            for ident in sorted(now[kind] - before[kind]):
                got = self.docker(inspect, "inspect", ident, check=False)
                if got.returncode != 0:
                    continue  # gone since
                (attrs,) = json.loads(got.stdout)
                labels = (attrs.get("Config") or attrs).get("Labels") or {}
                if LABEL in labels:
                    continue
                found.append(_describe(inspect, attrs, ran))
        return found

    def empty(self, baseline_images: set[str]) -> None:
        """Everything made since the stand-ins went, so each path starts as the first did
        (its builds with no cache to hit)."""
        if ids := self.docker("ps", "-aq").stdout.split():
            self.docker("rm", "-fv", *ids, check=False)
        networks = self.docker("network", "ls", "--format", "{{.ID}} {{.Name}}").stdout
        for line in networks.splitlines():
            ident, name = line.split()
            if name in BUILTIN_NETWORKS:
                continue
            # dockerd 20.10 keeps the endpoint of a running container that was connected to
            # a network and then removed (api_network_test's test_connect_with_aliases):
            # only a forced disconnect lets the network go, and its bridge with it.
            inspected = self.docker("network", "inspect", ident, check=False)
            if inspected.returncode == 0:
                (attrs,) = json.loads(inspected.stdout)
                for container, endpoint in (attrs.get("Containers") or {}).items():
                    for name in (container, endpoint.get("Name", "")):
                        gone = self.docker("network", "disconnect", "-f", ident, name, check=False)
                        if gone.returncode == 0:
                            break
            self.docker("network", "rm", ident, check=False)
        if vols := self.docker("volume", "ls", "-q").stdout.split():
            self.docker("volume", "rm", "-f", *vols, check=False)
        images = set(self.docker("images", "-aq", "--no-trunc").stdout.split()) - baseline_images
        if images:
            self.docker("rmi", "-f", *sorted(images), check=False)
        self.docker("builder", "prune", "-af", check=False)
        self.stand_ins()


def remove_bridge(name: str) -> None:
    """The host bridge `name` and the veths still in it, if it is there."""
    if run(["ip", "link", "show", name], check=False).returncode != 0:
        return
    members = run(["ip", "-br", "link", "show", "master", name], check=False).stdout
    for line in members.splitlines():
        run(["ip", "link", "delete", line.split()[0].split("@")[0]], check=False)
    run(["ip", "link", "delete", name], check=False)


def _describe(kind: str, attrs: dict, ran: dict[str, tuple[float, float]]) -> str:
    created = attrs.get("Created") or attrs.get("CreatedAt") or ""
    try:
        test = made_during(engine_time(created), ran) or "no test (between tests)"
    except ValueError:
        test = "unknown"
    return f"{_what(kind, attrs)}, made {created} during {test}"


def _what(kind: str, attrs: dict) -> str:
    if kind == "container":
        cfg = attrs.get("Config") or {}
        cmd = " ".join(cfg.get("Cmd") or [])
        name = attrs.get("Name", "").lstrip("/")
        return (
            f"container {name} ({attrs['Id'][:12]}, image {cfg.get('Image')}, "
            f"command {cmd!r}, labels {cfg.get('Labels') or {}})"
        )
    name = attrs.get("Name", "")
    return f"{kind} {name} (labels {attrs.get('Labels') or {}})"


STAND_IN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
STAND_IN_DIRS = (
    "bin", "dev", "etc", "home", "lib", "media", "mnt", "opt", "proc", "root", "run", "sbin",
    "srv", "sys", "tmp", "usr", "usr/bin", "usr/sbin", "usr/local", "usr/local/bin", "var",
    "var/cache", "var/empty", "var/lib", "var/local", "var/lock", "var/log", "var/mail",
    "var/opt", "var/spool", "var/tmp",
)  # fmt: skip
# alpine's own users and groups, those the tests name (postgres) among them.
STAND_IN_PASSWD = """\
root:x:0:0:root:/root:/bin/sh
bin:x:1:1:bin:/bin:/sbin/nologin
daemon:x:2:2:daemon:/sbin:/sbin/nologin
adm:x:3:4:adm:/var/adm:/sbin/nologin
lp:x:4:7:lp:/var/spool/lpd:/sbin/nologin
sync:x:5:0:sync:/sbin:/bin/sync
shutdown:x:6:0:shutdown:/sbin:/sbin/shutdown
halt:x:7:0:halt:/sbin:/sbin/halt
mail:x:8:12:mail:/var/mail:/sbin/nologin
news:x:9:13:news:/usr/lib/news:/sbin/nologin
operator:x:11:0:operator:/root:/sbin/nologin
man:x:13:15:man:/usr/man:/sbin/nologin
postmaster:x:14:12:postmaster:/var/mail:/sbin/nologin
cron:x:16:16:cron:/var/spool/cron:/sbin/nologin
ftp:x:21:21::/var/lib/ftp:/sbin/nologin
sshd:x:22:22:sshd:/dev/null:/sbin/nologin
at:x:25:25:at:/var/spool/cron/atjobs:/sbin/nologin
squid:x:31:31:Squid:/var/cache/squid:/sbin/nologin
xfs:x:33:33:X Font Server:/etc/X11/fs:/sbin/nologin
games:x:35:35:games:/usr/games:/sbin/nologin
postgres:x:70:70::/var/lib/postgresql:/bin/sh
cyrus:x:85:12::/usr/cyrus:/sbin/nologin
vpopmail:x:89:89::/var/vpopmail:/sbin/nologin
ntp:x:123:123:NTP:/var/empty:/sbin/nologin
smmsp:x:209:209:smmsp:/var/spool/mqueue:/sbin/nologin
guest:x:405:100:guest:/dev/null:/sbin/nologin
nobody:x:65534:65534:nobody:/:/sbin/nologin
"""
STAND_IN_GROUP = """\
root:x:0:root
bin:x:1:root,bin,daemon
daemon:x:2:root,bin,daemon
adm:x:4:root,adm,daemon
mail:x:12:mail
postgres:x:70:
users:x:100:games
nogroup:x:65533:
nobody:x:65534:
"""


def stand_in_rootfs(where: Path, busybox: Path = Path("/bin/busybox")) -> None:
    """A tar of a rootfs shaped like alpine's, with Debian's busybox-static and its
    applets' links in /bin (engine.sh's test image, with alpine's directories and users)."""
    applets = run([str(busybox), "--list"]).stdout.split()

    def entry(name: str, kind: bytes, mode: int, data: bytes = b"", link: str = "") -> None:
        info = tarfile.TarInfo(name)
        info.type, info.mode, info.linkname, info.size = kind, mode, link, len(data)
        tar.addfile(info, io.BytesIO(data) if data else None)

    with tarfile.open(where, "w") as tar:
        for d in STAND_IN_DIRS:
            entry(d, tarfile.DIRTYPE, 0o1777 if d in ("tmp", "var/tmp") else 0o755)
        entry("bin/busybox", tarfile.REGTYPE, 0o755, busybox.read_bytes())
        for applet in applets:
            if applet != "busybox":
                entry(f"bin/{applet}", tarfile.SYMTYPE, 0o777, link="busybox")
        entry("etc/passwd", tarfile.REGTYPE, 0o644, STAND_IN_PASSWD.encode())
        entry("etc/group", tarfile.REGTYPE, 0o644, STAND_IN_GROUP.encode())
        entry("etc/hostname", tarfile.REGTYPE, 0o644, b"localhost\n")
