"""The labelling Docker socket: every connection forwarded to an engine, with its owner's
label added to what it creates.

Each client connection gets a connection of its own to the engine, served by two threads:
the requests (reader.py: read with h11, creations labelled as the engine will read them,
bounded in memory by one Budget for the whole proxy, shared out by owner) and the responses
(responses.py: passed on byte for byte, read only as far as their framing). Whose a
connection's creations are is the Policy's answer (policy.py), asked once per connection:
`exitwatch run` labels them all with its own owner, `exitwatch adopt` finds each client's.
How many connections are served at once, in all and per client, is limits.py's: past
either, or when no thread can be started, a client is answered 503 and closed, and the
accept loop goes on.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import select
import socket
import struct
import threading
import time
from collections.abc import Callable

import h11

from exitwatch.engine.oneshot import OneShot
from exitwatch.engine.url import Endpoint
from exitwatch.proxy import limits, relay, volumes
from exitwatch.proxy.policy import Owned, Policy, Refuse
from exitwatch.proxy.reader import Budget, Reader
from exitwatch.proxy.responses import Responses

log = logging.getLogger(__name__)

BACKLOG = 128
ACCEPT_PAUSE = 0.05  # seconds before accepting again after accept() failed
M_MMAP_THRESHOLD, M_ARENA_MAX = -3, -8  # mallopt(3)
MMAP_THRESHOLD = 128 * 1024  # bytes: blocks this large go back to the system once freed
ARENAS = 1  # the GIL serialises the threads' allocations anyway


class ProxyError(Exception):
    """The run's socket cannot be set up; the message is one line."""


class Proxy:
    """Serves `listener` (a bound, listening unix socket) until stop(), forwarding to the
    engine at `engine`, each connection's creations labelled as `policy` says."""

    def __init__(
        self,
        listener: socket.socket,
        engine: Endpoint,
        policy: Policy,
        bounds: limits.Limits | None = None,
    ) -> None:
        self._gate = limits.Gate(bounds or limits.of_process())
        self._listener, self._engine, self._policy = listener, engine, policy
        self._calls = OneShot(engine, volumes.TIMEOUT)  # the proxy's own requests
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._workers = relay.Workers()
        self.reached = False  # the engine took a connection: things may be made through it
        self._budget = Budget()
        # What wakes the accept loop at stop(). Not shutdown() of the listener: its open file
        # description may be systemd's too (exitwatch-adopt.socket), and a shut one listens
        # for nobody, systemd's copy included, until the socket unit is restarted.
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)

    def start(self) -> None:
        _bounded_malloc()
        self._thread = threading.Thread(target=self._serve, name="exitwatch-proxy", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop accepting and cut every connection still open."""
        self._stopping = True
        with contextlib.suppress(OSError):  # EBADF: stopped already
            os.write(self._wake_w, b"x")  # wakes the accept loop's poll
        if self._thread is not None:
            self._thread.join(2.0)
        self._listener.close()  # this process's descriptor; a copy of systemd's listens on
        wake, self._wake_r, self._wake_w = (self._wake_r, self._wake_w), -1, -1
        for fd in wake:
            if fd >= 0:  # a second stop() has nothing left to close
                os.close(fd)
        with self._lock:
            relay.cut(*self._open)
        self._workers.close()

    def _serve(self) -> None:
        log.debug(
            "at most %d connections at once, %d per client (%s)",
            self._gate.limits.total,
            self._gate.limits.per_client,
            self._gate.limits.why,
        )
        poller = select.poll()
        poller.register(self._listener, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        while not self._stopping:
            try:
                if self._wake_r in (fd for fd, _ in poller.poll()) or self._stopping:
                    return
                client, _ = self._listener.accept()
            except OSError:
                if self._stopping:
                    return
                # EMFILE and the like: clients wait in the backlog meanwhile.
                time.sleep(ACCEPT_PAUSE)
                continue
            try:
                self._admit(client)
            except Exception:  # a bug of ours: this client is lost, never the accept loop
                log.exception("proxy accept")
                client.close()

    def _admit(self, client: socket.socket) -> None:
        """Serve `client` on a worker, or answer it at once that it cannot be served now:
        over the total, or when no thread can be started (a task limit)."""
        total = self._gate.limits.total
        if not self._gate.enter():
            self._gate.turn_away(client, f"{total} connections are open, the most at once")
            return
        try:
            self._workers.submit(self._connection, client)
        except RuntimeError as err:  # "can't start new thread"
            self._gate.leave()
            self._gate.turn_away(client, f"no thread could be started to serve it ({err})")

    def _connection(self, client: socket.socket) -> None:
        try:
            self._connection_of(client)
        finally:
            self._gate.leave()

    def _connection_of(self, client: socket.socket) -> None:
        try:
            owner = self._policy.owner_for(client)
        except Exception as err:  # a policy that failed cannot say the owner: no creations
            log.exception("proxy policy")
            owner = Refuse(f"the owner of this connection could not be found ({err})")
        if isinstance(owner, str):
            owner = Owned(owner)
        who = _client_key(client, owner)
        if not self._gate.claim(who):
            each = self._gate.limits.per_client
            self._gate.turn_away(client, f"this client holds {each} connections already")
            return
        try:
            self._served(client, owner)
        finally:
            self._gate.unclaim(who)

    def _served(self, client: socket.socket, owner: Owned | Refuse | None) -> None:
        try:
            upstream = self._engine.connect(None)
        except OSError as err:
            # The client sees the connection closed, as a dead engine's socket would refuse it.
            log.debug("engine %s: %s", self._engine, err.strerror)
            client.close()
            return
        self.reached = True
        with self._lock:
            self._open.update((client, upstream))
        back = threading.Event()
        try:
            if owner is None:  # nobody's: passed through untouched
                if self._other_half(client, back, relay.pump, upstream, client, b"", back):
                    relay.pump(client, upstream)
            else:
                responses = Responses(upstream, client)
                if self._other_half(client, back, _run, responses, back):
                    Reader(client, upstream, owner, responses, self._calls, self._budget).run()
        except (OSError, h11.ProtocolError) as err:
            log.debug("proxy connection: %s", err)
            relay.cut(client, upstream)
        except Exception:  # a bug of ours: this connection is lost, not the others
            log.exception("proxy connection")
            relay.cut(client, upstream)
        back.wait()
        with self._lock:
            self._open.difference_update((client, upstream))
        client.close()
        upstream.close()

    def _other_half(
        self, client: socket.socket, done: threading.Event, task: Callable[..., None], *args: object
    ) -> bool:
        """Start the connection's other direction (`task`, which sets `done`) on a worker;
        else answer the client that it cannot be served now, and say False."""
        try:
            self._workers.submit(task, *args)
            return True
        except RuntimeError as err:
            done.set()
            self._gate.turn_away(client, f"no thread could be started to serve it ({err})")
            return False


def _client_key(client: socket.socket, owner: Owned | Refuse | None) -> object:
    """Whose share a connection counts against: its owner's; for a connection of nobody's
    (a host client no rule matches) or of an owner not found, its client's uid."""
    if isinstance(owner, Owned):
        return owner.owner
    try:
        creds = client.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
    except OSError:
        return ("uid", None)
    return ("uid", struct.unpack("3i", creds)[1])


def _bounded_malloc() -> None:
    """Keep what the connections' threads free from staying in the process. glibc raises
    its mmap threshold as large blocks are freed, so that a creation body's later buffers
    come from the heap and stay there, and gives each thread an arena of its own: rounds of
    four creates at the body limit took the wrapper from 26 to 103-110 MB of RSS that way,
    and to 52 MB with the threshold fixed and one arena (engine/test_run_bounds.py)."""
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)  # not a glibc: left as it is
    if mallopt is not None:
        mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
        mallopt(M_ARENA_MAX, ARENAS)


def _run(responses: Responses, done: threading.Event) -> None:
    try:
        responses.run()
    finally:
        done.set()


def listen(directory: str, dir_fd: int | None = None, name: str = "docker.sock") -> socket.socket:
    """A listening unix socket `name` in `directory`; ProxyError if the path is too long
    for a socket address (sun_path holds 108 bytes). With `dir_fd`, a descriptor of
    `directory`, it is bound in that directory whatever `directory` names by then."""
    path = os.path.join(directory, name)
    if len(os.fsencode(path)) >= 108:
        raise ProxyError(f"{path}: too long for a unix socket address (108 bytes at most)")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(path if dir_fd is None else f"/proc/self/fd/{dir_fd}/{name}")
        # Past the umask: under one of 0777 it would be 0000, which CMD could not connect to.
        os.chmod(path if dir_fd is None else name, 0o600, dir_fd=dir_fd)
        listener.listen(BACKLOG)
    except OSError as err:
        listener.close()
        raise ProxyError(f"cannot listen on {path}: {err.strerror}") from None
    return listener
