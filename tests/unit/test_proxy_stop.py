"""A stopped proxy leaves its listening socket listening for whoever else holds it: systemd
holds exitwatch-adopt.socket's, and a restart of the service must find it as it was. The
proxy used to shutdown() the listener to wake its accept(), which shut systemd's copy too
(systemd then logged POLLHUP and failed the socket unit, as a booted VM showed)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from exitwatch.engine.url import Endpoint
from exitwatch.proxy.policy import Always
from exitwatch.proxy.server import Proxy


def test_a_stopped_proxy_leaves_the_socket_systemd_holds_listening(tmp_path: Path) -> None:
    path = str(tmp_path / "adopt.sock")
    held = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # systemd's descriptor
    held.bind(path)
    held.listen(16)
    passed = socket.socket(fileno=os.dup(held.fileno()))  # what the service is handed
    proxy = Proxy(passed, Endpoint.parse(f"unix://{tmp_path}/engine.sock"), Always("x"))
    proxy.start()
    proxy.stop()
    proxy.stop()  # twice: nothing left to close, nothing raised
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.settimeout(5)
        client.connect(path)  # refused if the listener had been shut down
        held.settimeout(5)
        accepted, _ = held.accept()
        accepted.close()
    held.close()
