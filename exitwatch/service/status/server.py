"""The status socket: read-only, served from a thread of its own; and query(), which asks it."""

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
from collections.abc import Callable, Mapping
from typing import Any

log = logging.getLogger(__name__)

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

    def __init__(self, path: str, snapshot: Callable[[], Mapping[str, Any]]) -> None:
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
        raise StatusError(
            f"another agent already answers on {path}: stop it (systemctl stop exitwatch), "
            "or give this one --status-socket of its own"
        )
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise StatusError(
                f"{path} exists and is not a socket: move it away, or give --status-socket "
                "another path"
            )
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
