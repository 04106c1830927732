"""Moving a proxied connection's bytes: the worker threads that serve connections, and the
raw copy from one socket to the other, which goes through a pipe with splice(2) so that
no stream's bytes ever enter this process.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import queue
import socket
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

PIPE_SIZE = 1024 * 1024  # bytes per splice; pipe-max-size allows unprivileged pipes this much
SMALL_MOVE = 64 * 1024  # bytes: a move smaller than this may be one of many small pieces
BUSY_GAP = 0.001  # seconds: small pieces closer than this are a stream
BATCH_PAUSE = 0.0005  # seconds a stream's next move waits, to take more pieces at once
IDLE_EXIT = 10.0  # seconds a spare worker thread waits for a connection before it ends


class Workers:
    """Daemon threads, each reused once its task is done: a connection costs two of them,
    and starting two threads would cost more than the proxying itself. They are never
    more than the peak of tasks at once, and a spare one ends after IDLE_EXIT seconds."""

    def __init__(self) -> None:
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        self._idle = 0
        self._lock = threading.Lock()

    def submit(self, task: Callable[..., None], *args: object) -> None:
        """Run `task(*args)` on a spare worker, else on a new one. Raises RuntimeError when
        a new one is needed and cannot be started (a task limit): nothing is queued then,
        and the count of spare workers stays right."""
        with self._lock:
            if self._idle:
                self._idle -= 1  # that one takes it
                self._tasks.put((task, args))
                return
        first = (task, args)
        threading.Thread(
            target=self._work, args=(first,), name="exitwatch-proxy", daemon=True
        ).start()

    def close(self) -> None:
        """End the spare workers now rather than after IDLE_EXIT."""
        with self._lock:
            spare, self._idle = self._idle, 0
        for _ in range(spare):
            self._tasks.put(None)

    def _work(self, first: tuple[Callable[..., None], tuple]) -> None:
        self._run(*first)
        while True:
            try:
                item = self._tasks.get(timeout=IDLE_EXIT)
            except queue.Empty:
                with self._lock:
                    # idle counts the waiting workers less the queued tasks: while it is 0,
                    # a task may be on its way to this one.
                    if self._idle:
                        self._idle -= 1
                        return
                continue
            if item is None:
                return
            self._run(*item)

    def _run(self, task: Callable[..., None], args: tuple) -> None:
        try:
            task(*args)
        except Exception:  # a bug of ours: the connection is lost, the proxy is not
            log.exception("proxy connection")
        with self._lock:
            self._idle += 1


def pump(
    src: socket.socket, dst: socket.socket, first: bytes = b"", done: threading.Event | None = None
) -> None:
    """Copy `src` to `dst` until `src` ends, then end `dst`'s sending half (half-close: a
    `docker exec -i` client ends its stdin so). On an error, cut both ends. Sets `done`."""
    try:
        if first:
            dst.sendall(first)
        copy(src, dst, None)
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        cut(src, dst)
    finally:
        if done is not None:
            done.set()


def cut(*socks: socket.socket) -> None:
    """End both directions of each: whoever is blocked on one wakes up."""
    for s in socks:
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)


def copy(src: socket.socket, dst: socket.socket, limit: int | None) -> int:
    """Copy `limit` bytes (None: until the end) from `src` to `dst`; how many were copied.

    The bytes go through a pipe with splice(2): they never enter this process, which holds
    no buffer for a connection however long it lasts or however fast it streams.
    """
    r, w = os.pipe()
    with contextlib.suppress(OSError):  # fewer, larger moves; the default 64 KiB still works
        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
    done, last = 0, float("-inf")
    try:
        while limit is None or done < limit:
            want = PIPE_SIZE if limit is None else min(PIPE_SIZE, limit - done)
            n = os.splice(src.fileno(), w, want, flags=os.SPLICE_F_MOVE)
            if not n:
                break
            done += n
            small = n < SMALL_MOVE
            while n:
                n -= os.splice(r, dst.fileno(), n, flags=os.SPLICE_F_MOVE)
            if small:
                # A stream written in small pieces (the engine's exec frames of a few KiB,
                # a client's stdin) would wake this thread for each one: that CPU is taken
                # from the engine and the client on a small host. Once one small piece
                # follows another closely, the next move waits for more; a lone piece (a
                # prompt, a keystroke's echo) never waits.
                now = time.monotonic()
                if now - last < BUSY_GAP:
                    time.sleep(BATCH_PAUSE)
                last = now
    finally:
        os.close(r)
        os.close(w)
    return done
