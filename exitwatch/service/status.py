"""The status socket (read-only, served from its own thread) and its readable view."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import selectors
import socket
import stat
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

SCHEMA = 1
SEND_TIMEOUT = 1.0  # a client that does not read within this is dropped
ACCEPT_PAUSE = 0.1  # after a failed accept (no fd free), before trying again
SOCKET_MODE = 0o660


class StatusError(Exception):
    pass


class StatusServer:
    """Answers every connection with one JSON document, then closes it.

    It never reads from a client, so nothing sent to it can make the agent do anything; a
    client that does not read is dropped after SEND_TIMEOUT, and `snapshot` is the only
    call into the agent, which bounds its own wait.
    """

    def __init__(self, path: str, snapshot: Callable[[], dict]) -> None:
        self.path = path
        self._snapshot = snapshot
        self._sock = _bind(path)
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._thread = threading.Thread(target=self._serve, name="exitwatch-status", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop serving and remove the socket."""
        os.write(self._wake_w, b"x")
        self._thread.join(timeout=SEND_TIMEOUT + 1)
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISSOCK(os.lstat(self.path).st_mode):
                os.unlink(self.path)
        self._sock.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _serve(self) -> None:
        with selectors.DefaultSelector() as sel:
            sel.register(self._sock, selectors.EVENT_READ)
            sel.register(self._wake_r, selectors.EVENT_READ)
            while True:
                for key, _ in sel.select():
                    if key.fileobj == self._wake_r:
                        return
                    self._answer()

    def _answer(self) -> None:
        try:
            conn, _ = self._sock.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            # No fd free (EMFILE, ENFILE): the client stays queued and the socket readable,
            # so the loop would spin on it. Pause, still woken at once by close().
            select.select([self._wake_r], [], [], ACCEPT_PAUSE)
            return
        with conn:
            try:
                body = json.dumps(self._snapshot(), default=str).encode() + b"\n"
                conn.settimeout(SEND_TIMEOUT)
                conn.sendall(body)
            except OSError:
                pass  # the client went away or would not read: its loss
            except Exception:
                log.exception("status: cannot build the status")


def _bind(path: str) -> socket.socket:
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    if query(path, timeout=1.0) is not None:
        raise StatusError(f"another agent already answers on {path}")
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise StatusError(f"{path} exists and is not a socket")
        os.unlink(path)  # a stale socket of an agent that died
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        # Born with its final mode: a chmod after bind would leave a moment in which the
        # socket has the process umask's looser mode. The umask is process-wide, but the
        # agent binds before it starts removing anything, and a narrower umask only
        # ever takes permissions away.
        old = os.umask(0o777 & ~SOCKET_MODE)
        try:
            sock.bind(path)
        finally:
            os.umask(old)
        sock.listen(16)
    except OSError as err:
        sock.close()
        raise StatusError(f"cannot serve status on {path}: {err.strerror}") from None
    sock.setblocking(False)
    return sock


def query(path: str, timeout: float = 5.0) -> dict | None:
    """The running agent's status, or None when no agent answers on `path`."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    sock.settimeout(timeout)
    try:
        sock.connect(path)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    except OSError:
        return None
    finally:
        sock.close()
    try:
        return json.loads(b"".join(chunks))
    except ValueError:
        return None


def render(status: dict) -> str:
    """The readable view of a status document (of a running agent, or of a one-shot scan)."""
    out = []
    agent = status.get("agent")
    if agent:
        out.append(
            f"exitwatch {agent['version']} (pid {agent['pid']}), up {_age(agent['uptime_s'])}"
        )
        out.append(f"  source:   {agent['source']} ({agent['source_reason']})")
        if agent.get("dry_run"):
            out.append("  dry run:  nothing is removed")
    else:
        out.append("no agent answers: a one-shot scan shows what it would find (nothing removed)")
        skipped = status.get("skipped_markers")
        if skipped:
            noun = "marker" if skipped == 1 else "markers"
            out.append(f"  {skipped} {noun} skipped; `exitwatch reap --dry-run` lists them")
        out += [f"  not listed: {why}" for why in status.get("not_listed", ())]
    docker = status.get("docker") or {}
    if docker:
        health = "connected" if docker.get("connected") else f"DOWN ({docker.get('last_error')})"
        extra = f", {docker['reconnects']} reconnects" if docker.get("reconnects") else ""
        out.append(f"  docker:   {docker.get('endpoint')}: {health}{extra}")
    discovery = (status.get("workdirs") or {}).get("discovery")
    if discovery:
        out.append(f"  workdirs: {discovery}")
    rescans = status.get("processes")
    if rescans and rescans.get("failing"):
        out.append(
            f"  leftover processes: rescan FAILING ({rescans['failing']} times in a row: "
            f"{rescans.get('last_error')})"
        )
    elif rescans:
        out.append(f"  leftover processes: rescanned every {rescans['interval_s']:g} s")
    counters = status.get("counters")
    if counters:
        out.append(
            "  counters: "
            + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in sorted(counters.items()))
        )
    if status.get("reconcile"):
        out.append(f"  reconcile: {_reconcile(status['reconcile'])}")
    owners = status.get("owners", [])
    out += ["", f"owners watched: {len(owners)}"]
    for owner in owners:
        out.extend(_owner_lines(owner))
    pending = status.get("pending", [])
    out += ["", f"orphans pending: {len(pending)}"]
    for item in pending:
        line = f"  {item['owner']} ({item.get('death', 'dead')}): {', '.join(item['what'])}"
        if item.get("attempt"):
            line += f" [attempt {item['attempt']}, {item.get('state', '')}]"
        out.append(line)
    reaps = status.get("reaps")
    if reaps is not None:
        out += ["", f"recent removals: {len(reaps)}"]
        for reap in reaps:
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(reap["time"]))
            out.append(
                f"  {when} {reap['result']}: {reap['what']} owner={reap['owner']} "
                f"death={reap['death']!r} latency={reap['latency_ms']} ms"
            )
    # Paths, project names and errors come from users; each line reaches a terminal.
    return "\n".join(map(_escaped, out))


def _escaped(line: str) -> str:
    """`line` with every unprintable character (ESC, CSI, a newline, a bidi override)
    written as its escape, so no user-chosen name can drive the operator's terminal."""
    if line.isprintable():
        return line
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in line)


def _reconcile(rec: dict) -> str:
    every = f"every {rec['interval_s']:g} s" if rec.get("interval_s") else "only at start"
    last = rec.get("last")
    if not last:
        return f"{every}; the start-up listing is not in yet"
    when = time.strftime("%H:%M:%S", time.localtime(last["at"]))
    if last.get("start_up"):
        text = f"{every}; last at start, {when}"
    else:
        text = (
            f"{every}; last {when}: {last['listed']} listed in {last['took_s']} s, "
            f"{last['missed']} unknown to the index, {last['orphaned']} of dead owners"
        )
        if last.get("errors"):
            text += f"; could not list {'; '.join(last['errors'])}"
    if rec.get("running"):
        text += "; one is listing now"
    return text


def _owner_lines(owner: dict) -> list[str]:
    lines = [f"  {owner['owner']} (pid {owner['pid']})"]
    for c in owner.get("containers", []):
        project = f", project {c['project']}" if c.get("project") else ""
        lines.append(f"    container {c['id'][:12]} ({c['name']}{project})")
    lines.extend(f"    workdir {w}" for w in owner.get("workdirs", []))
    lines.extend(f"    hook {h}" for h in owner.get("hooks", []))
    lines.extend(f"    {p}" for p in owner.get("processes", []))
    return lines


def _age(seconds: float) -> str:
    seconds = int(seconds)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h {minutes}m"
    if hours:
        return f"{hours}h {minutes}m"
    return f"{minutes}m {secs}s"
