"""The one engine call a bulk reap makes by the thousand, DELETE /containers/ID, sent straight
over the engine's unix socket with http.client.

docker-py's requests stack costs several times the CPU per call (docs/design.md,
"Containers", has the figures); in a bulk reap on a small host that CPU is taken from
dockerd itself, whose removal rate is the limit. Every other call stays on docker-py.
"""

from __future__ import annotations

import http.client
import json
import socket
from urllib.parse import quote

import requests
from docker.errors import APIError, NotFound


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def remove_container(socket_path: str, version: str, cid: str, timeout: float) -> None:
    """Remove container `cid`, running or not, with its anonymous volumes: docker-py's
    remove_container(cid, force=True, v=True). Raises NotFound, APIError or OSError."""
    url = f"/v{version}/containers/{quote(cid, safe='')}?force=1&v=1"
    conn = _UnixConnection(socket_path, timeout)
    try:
        conn.request("DELETE", url)
        answer = conn.getresponse()
        body = answer.read()
    except http.client.HTTPException as err:
        raise OSError(f"the engine did not answer in HTTP: {err!r}") from None
    finally:
        conn.close()
    if 200 <= answer.status < 300:
        return
    # docker-py's errors, so that callers tell "already gone" and "in progress" as before;
    # anything but a 2xx is an error (a redirect too: nothing was removed).
    response = requests.Response()
    response.status_code, response.reason = answer.status, answer.reason
    response.url = f"http+docker://localhost{url}"
    error = NotFound if answer.status == 404 else APIError
    raise error(f"{answer.status} {answer.reason}", response, _message(body))


def _message(body: bytes) -> str:
    """The engine's {"message": ...}, or the body as text."""
    try:
        doc = json.loads(body)
    except ValueError:
        return body.decode("utf-8", "replace").strip()
    return str(doc.get("message", "")) if isinstance(doc, dict) else str(doc)
