"""sd_notify: READY=1, WATCHDOG=1, RELOADING=1 and STOPPING=1 over systemd's datagram socket."""

from __future__ import annotations

import contextlib
import os
import socket
import time


class Notifier:
    """A no-op unless systemd gave us NOTIFY_SOCKET."""

    def __init__(self, environ: dict[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        addr = env.get("NOTIFY_SOCKET", "")
        # "@name" is an abstract socket.
        self._addr = "\0" + addr[1:] if addr.startswith("@") else addr
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        mine = not pid or pid == str(os.getpid())
        # Half the timeout, as sd_watchdog_enabled(3) advises.
        self.watchdog_interval = int(usec) / 2e6 if usec.isdigit() and mine else None
        self._last_ping = float("-inf")

    def ping(self) -> None:
        """WATCHDOG=1, at most once per watchdog interval however often it is called."""
        if self.watchdog_interval is None:
            return
        now = time.monotonic()
        if now - self._last_ping >= self.watchdog_interval:
            self._last_ping = now
            self.send("WATCHDOG=1")

    def send(self, message: str) -> None:
        if not self._addr:
            return
        # A systemd that went away has nobody to tell.
        with (
            socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock,
            contextlib.suppress(OSError),
        ):
            sock.sendto(message.encode(), self._addr)
