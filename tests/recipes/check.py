"""docs/hooks.md's remote-sandbox recipes checked against each provider's package from PyPI
(`make test-recipes`; docs/hooks.md, "How these were checked"). It needs PyPI and root
(`unshare -n`), so `make test` does not run it.

For each provider: a venv of its own under build/recipes/ with the version the page names
(the newest with --latest); the page's creation block bound against the SDK's signatures;
its hook-and-lease block run as written, this checkout's exitwatch writing into spools of
its own; then each hook and lease read back from the spool and run as the agent runs them
(the agent's own spawn code: a minimal environment plus theirs, an empty HOME, their
timeout), with a bogus key: with the network cut it must fail on the network; against a
local stand-in of the provider's API (HTTP, or gRPC for Modal: modal_standin.py) refusing
the key, on the credentials; answering "not found", the hook must succeed and the lease
fail on "not found". The page's plain HTTP recipe runs against the HTTP stand-in alone.
The SDK is in the venv, not here: probe.py runs there."""

from __future__ import annotations

import argparse
import contextlib
import http.server
import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from unittest import mock

from page import (
    BOGUS,
    BUILD,
    PROVIDERS,
    SANDBOX_ID,
    Provider,
    blocks,
    pinned,
    read,
    this_exitwatch,
)

HERE = os.path.dirname(os.path.abspath(__file__))
PROBE = os.path.join(HERE, "probe.py")
MODAL_STANDIN = os.path.join(HERE, "modal_standin.py")

# What a failure says, read from the last lines of its output.
ARGUMENTS = re.compile(
    r"\b(TypeError|AttributeError|NameError|ImportError|ModuleNotFoundError|SyntaxError|"
    r"ValidationError|KeyError|UnboundLocalError|InvalidError)\b"
)
NETWORK = re.compile(
    r"name resolution|resolving DNS|Could not connect|ConnectError|Connection refused|"
    r"Network is unreachable|ConnectionError|Could not resolve host|connect to server",
    re.I,
)
CREDENTIALS = re.compile(r"\b401\b|unauthori[sz]ed|authentication|credentials|AuthError", re.I)
NOT_FOUND = re.compile(r"\b404\b|not found|NotFound", re.I)


class StandIn:
    """A local stand-in of a provider's HTTP API: every request answered with one status
    and a JSON body, each request's method, path and Authorization header remembered."""

    def __init__(self) -> None:
        self.status = 404
        self.seen: list[tuple[str, str, str]] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def answer(self) -> None:
                if n := int(self.headers.get("Content-Length") or 0):
                    self.rfile.read(n)
                outer.seen.append((self.command, self.path, self.headers.get("Authorization", "")))
                body = json.dumps(
                    # the error fields of each provider's API: E2B's code, Daytona's statusCode
                    {
                        "code": outer.status,
                        "statusCode": outer.status,
                        "message": "stand-in",
                        "detail": "stand-in",
                    }
                ).encode()
                self.send_response(outer.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = answer

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


def spools(tmp: str) -> dict[str, str]:
    """Hook and lease spools as exitwatch wants them: root's, mode 1733."""
    env = {}
    for var, sub in (("EXITWATCH_HOOK_DIR", "hooks"), ("EXITWATCH_LEASE_DIR", "leases")):
        path = os.path.join(tmp, sub)
        os.mkdir(path)
        os.chmod(path, 0o1733)
        env[var] = path
    return env


def entries(spool_env: dict[str, str]) -> list[dict]:
    """What the block registered, read back from the spools as the agent reads it."""
    found = []
    for var, kind, name in (
        ("EXITWATCH_HOOK_DIR", "hook", "hook.json"),
        ("EXITWATCH_LEASE_DIR", "lease", "lease.json"),
    ):
        for entry in sorted(os.listdir(spool_env[var])):
            path = os.path.join(spool_env[var], entry, name)
            with open(path, encoding="utf-8") as f:
                found.append({"kind": kind, "uid": os.stat(path).st_uid, **json.load(f)})
    return found


def run_entry(
    entry: dict, home: str, extra: dict[str, str], offline: bool
) -> tuple[int | None, str, float]:
    """Run a hook or a lease with the agent's own code (docs/hooks.md, "How a hook runs"):
    as the user of the entry's file, the minimal environment, then the entry's, then the
    owner's variable; in its directory, its own process group killed at its timeout. HOME
    is an empty directory, as /root and /home are hidden under exitwatch.service."""
    from exitwatch.kinds.spool.spawn import environment, run_as

    user = pwd.getpwuid(entry["uid"])
    owner = "EXITWATCH_DEAD_OWNER" if entry["kind"] == "hook" else "EXITWATCH_LEASE_OWNER"
    env = environment(user, {**entry["env"], **extra, owner: entry["owner"]})
    env["HOME"] = home
    argv = (["unshare", "-n"] if offline else []) + entry["argv"]
    ran = run_as(user, argv, env, entry["cwd"], entry["timeout"])
    return (None if ran.timed_out else ran.returncode), ran.tail, ran.seconds


def last_line(output: str) -> str:
    lines = [line.strip() for line in output.strip().splitlines() if line.strip()]
    return lines[-1][:220] if lines else "(no output)"


class Tally:
    def __init__(self) -> None:
        self.passed = self.failed = 0

    def check(self, ok: bool, what: str, detail: str = "") -> None:
        self.passed += ok
        self.failed += not ok
        print(f"  {'ok  ' if ok else 'FAIL'} {what}" + (f": {detail}" if detail else ""))


def expect(tally: Tally, what: str, rc: int | None, out: str, secs: float, want: str) -> None:
    """want: 'network', 'credentials', 'not found' (a failure saying so) or 'done' (exit 0)."""
    said = (
        f"exit {rc}, {secs:.1f} s: {last_line(out)}"
        if rc is not None
        else f"timed out after {secs:.0f} s"
    )
    if want == "done":
        tally.check(rc == 0, what, said)
        return
    pattern = {"network": NETWORK, "credentials": CREDENTIALS, "not found": NOT_FOUND}[want]
    tail = "\n".join(out.strip().splitlines()[-3:])
    ok = rc not in (0, None) and bool(pattern.search(tail)) and not ARGUMENTS.search(tail)
    tally.check(ok, f"{what} fails on the {want}", said)


def venv(name: str, provider: Provider, latest: bool, python: str) -> str:
    path = os.path.join(BUILD, f"venv-{name}")
    pins = [] if latest else pinned(provider)
    wanted = pins or list(provider.packages)
    stamp = os.path.join(path, "recipes-installed")
    if latest or read(stamp) != " ".join(wanted):
        shutil.rmtree(path, ignore_errors=True)
        subprocess.run([python, "-m", "venv", path], check=True)
        pip = subprocess.run(
            [
                os.path.join(path, "bin", "python"),
                "-m",
                "pip",
                "install",
                "-q",
                "--upgrade",
                *wanted,
            ],
            capture_output=True,
            text=True,
        )
        if pip.returncode != 0:
            raise SystemExit(
                f"pip install {' '.join(wanted)}: exit {pip.returncode}\n{pip.stderr[-3000:]}"
            )
        with open(stamp, "w") as f:
            f.write(" ".join(wanted))
    return os.path.join(path, "bin", "python")


def check_provider(name: str, tally: Tally, latest: bool, python: str, stand_in: StandIn) -> None:
    provider = PROVIDERS[name]
    print(f"== {provider.heading}")
    py = venv(name, provider, latest, python)
    with tempfile.TemporaryDirectory(prefix="recipes-") as tmp:
        spool_env = spools(tmp)
        home = os.path.join(tmp, "home")
        os.mkdir(home)
        env = {**os.environ, **spool_env, **{c: BOGUS for c in provider.creds}}
        done = subprocess.run(
            [py, "-I", PROBE, name],
            env=env,
            cwd=home,
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            tally.check(False, "the page's blocks run in the venv", last_line(done.stderr))
            print(done.stderr[-3000:])
            return
        report = json.loads(done.stdout.strip().splitlines()[-1])
        print("  " + ", ".join(f"{p} {v}" for p, v in report["versions"].items()))
        for note in report["notes"]:
            print(f"  note: {note}")
        tally.check(True, "creation block binds", "; ".join(report["bound"]))
        for ok, what in report["claims"]:
            tally.check(ok, what)
        if name == "prime":  # the page says why its hook is not the CLI
            stand_in.status = 404
            cli = os.path.join(os.path.dirname(py), "prime")
            gone = subprocess.run(
                [cli, "--plain", "sandbox", "delete", SANDBOX_ID, "--yes"],
                env={
                    "PATH": os.environ["PATH"],
                    "HOME": home,
                    "PRIME_API_KEY": BOGUS,
                    provider.url_env: stand_in.url,
                },
                capture_output=True,
                text=True,
                timeout=60,
            )
            tally.check(
                gone.returncode == 1,
                "`prime sandbox delete ID --yes` exits 1 on a sandbox gone already (404)",
                last_line(gone.stdout + gone.stderr),
            )
        found = entries(spool_env)
        kinds = sorted(e["kind"] for e in found)
        tally.check(
            kinds == ["hook", "lease"],
            "the block registers one hook and one lease",
            ", ".join(kinds),
        )
        for entry in found:
            tally.check(
                not any(BOGUS in a for a in entry["argv"]) and BOGUS in entry["env"].values(),
                f"{entry['kind']}: the key in its env, not its argv",
            )
            rc, out, secs = run_entry(entry, home, {}, offline=True)
            expect(tally, f"{entry['kind']}, network cut", rc, out, secs, "network")
            for status, want in (
                (401, "credentials"),
                (404, "done" if entry["kind"] == "hook" else "not found"),
            ):
                with answering(provider, py, stand_in, status) as (url, calls):
                    rc, out, secs = run_entry(entry, home, url, offline=False)
                expect(tally, f"{entry['kind']}, API answering {status}", rc, out, secs, want)
                # A bogus key may be refused before any call names the sandbox (Modal's is).
                reached = calls if status == 401 else [c for c in calls if SANDBOX_ID in c]
                tally.check(
                    bool(reached),
                    f"{entry['kind']}, API answering {status}: the call reached it",
                    "; ".join(calls)[:200],
                )


@contextlib.contextmanager
def answering(
    provider: Provider, py: str, stand_in: StandIn, status: int
) -> Iterator[tuple[dict[str, str], list[str]]]:
    """The provider's API stood in for, answering `status` (401 or 404; for a gRPC API,
    UNAUTHENTICATED or NOT_FOUND): the environment that sends its SDK there, and the list
    of the calls it got (filled in when the block ends), one string each."""
    calls: list[str] = []
    if not provider.grpc:
        stand_in.status, before = status, len(stand_in.seen)
        yield {provider.url_env: stand_in.url + provider.url_path}, calls
        calls += [f"{m} {p.split('?')[0]}" for m, p, _ in stand_in.seen[before:]]
        return
    grpc_status = {401: "UNAUTHENTICATED", 404: "NOT_FOUND"}[status]
    server = subprocess.Popen(
        [py, "-I", MODAL_STANDIN, grpc_status], stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        port = server.stdout.readline().strip()
        yield {provider.url_env: f"http://127.0.0.1:{port}"}, calls
    finally:
        server.terminate()
        out, _ = server.communicate(timeout=30)
        calls += [line for line in out.splitlines() if line.strip()]


def check_http(tally: Tally, stand_in: StandIn) -> None:
    """The page's curl recipe against the stand-in: 404 and 2xx delete, 401 and 500 fail;
    the lease succeeds on 2xx only; the token goes in a header, never in argv."""
    print("== Plain HTTP")
    hooks = blocks("Plain HTTP")[-1]
    exitwatch, _ = this_exitwatch()
    with tempfile.TemporaryDirectory(prefix="recipes-") as tmp:
        spool_env = spools(tmp)
        home = os.path.join(tmp, "home")
        os.mkdir(home)
        ns = {"exitwatch": exitwatch, "api": stand_in.url, "sandbox_id": SANDBOX_ID, "token": BOGUS}
        with mock.patch.dict(os.environ, spool_env):
            exec(compile(hooks, "docs/hooks.md (Plain HTTP)", "exec"), ns)
        found = entries(spool_env)
        tally.check(
            sorted(e["kind"] for e in found) == ["hook", "lease"],
            "the block registers one hook and one lease",
        )
        for entry in found:
            tally.check(
                not any(BOGUS in a for a in entry["argv"]),
                f"{entry['kind']}: the token not in its argv",
            )
            for status in (200, 204, 404, 401, 500):
                ok_when = (200, 204, 404) if entry["kind"] == "hook" else (200, 204)
                stand_in.status, before = status, len(stand_in.seen)
                rc, out, secs = run_entry(entry, home, {}, offline=False)
                asked = stand_in.seen[before:]
                header = bool(asked) and all(auth == f"Bearer {BOGUS}" for _, _, auth in asked)
                tally.check(
                    (rc == 0) == (status in ok_when) and header and rc is not None,
                    f"{entry['kind']}, API answering {status}: exit {rc}"
                    + (", the token in its header" if header else ", NO token in its header"),
                    "; ".join(f"{m} {p}" for m, p, _ in asked),
                )
            rc, out, secs = run_entry(entry, home, {}, offline=True)
            expect(tally, f"{entry['kind']}, network cut", rc, out, secs, "network")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--latest", action="store_true", help="each package's newest release")
    parser.add_argument(
        "--only", default="", help="providers, comma-separated (" + ",".join(PROVIDERS) + ",http)"
    )
    parser.add_argument(
        "--python", default=os.environ.get("RECIPES_PYTHON", "python3"), help="makes the venvs"
    )
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("test-recipes: run as root (spools of root's, unshare -n)", file=sys.stderr)
        return 2
    only = [n for n in args.only.split(",") if n] or [*PROVIDERS, "http"]
    this_exitwatch()  # the checkout's, on sys.path: its spawn code runs the entries
    tally, stand_in = Tally(), StandIn()
    os.makedirs(BUILD, exist_ok=True)
    for name in only:
        if name == "http":
            check_http(tally, stand_in)
        else:
            check_provider(name, tally, args.latest, args.python, stand_in)
    print(f"recipes: {tally.passed} passed, {tally.failed} failed")
    return 1 if tally.failed else 0


if __name__ == "__main__":
    sys.exit(main())
