"""The engine-to-client half of a proxied connection: the engine's responses, passed on byte
for byte, read only as far as their framing, so that the proxy knows where each ends.

That tells the request side two things. Whether the engine hijacked the connection: after
a request that may hijack (attach, exec start, an Upgrade), a 101, or a 200 of a raw stream
with no framing, means both directions are raw bytes from there on; any other answer is an
HTTP response like the rest, and the next bytes from the client are a request again. And
when every response so far has gone out, so that an answer of the proxy's own (100 Continue,
a refusal) takes its place in the order of the answers.

Bodies move with splice(2) where their length is known; a chunked body is read in the
process only for its chunk sizes, its big chunks spliced too.
"""

from __future__ import annotations

import collections
import select
import socket
import threading
import time
from dataclasses import dataclass, field

from exitwatch.proxy import relay

# Bytes per read of the engine's responses. Larger reads made a new connection's _ping
# 0.3 ms slower (the buffer past glibc's mmap threshold), and `docker cp` no faster.
CHUNK = 64 * 1024
# A response head longer than this is not one the proxy reads. The engine's are a few hundred
# bytes; the longest, a redirect's Location, is the request's path escaped (up to 3 times).
MAX_HEAD = 64 * 1024
MAX_LINE = 64 * 1024  # a chunk-size line or trailer longer than this, likewise
SPLICE_FROM = 64 * 1024  # bytes of a body left to pass: spliced from this many on
RAW_TYPES = (b"application/vnd.docker.raw-stream", b"application/vnd.docker.multiplexed-stream")


# What the engine's side of the connection is: HTTP responses still; raw bytes, for good (a
# hijack, or a body that ends with the connection: the engine reads no request after either);
# or ended (closed, or bytes that are not HTTP as the proxy reads them, which pass on as they
# are until the engine closes, while it might still read requests: it is sent no more, so
# that it ends its side once its answers are out, and the client then sees the end).
HTTP, RAW, ENDED = "http", "raw", "ended"


class _Lost(Exception):
    """The engine's bytes are not HTTP as the proxy reads it."""


@dataclass
class Expected:
    """A request sent on, whose response is to come."""

    head: bool  # a HEAD request: its response has no body, whatever it says
    hijacking: bool  # the engine may hijack the connection in answer
    answered: threading.Event = field(default_factory=threading.Event)


class Responses:
    """Passes the engine's responses on `upstream` to `client` (run() is the thread), and
    tells the request side what it needs to know about them."""

    def __init__(self, upstream: socket.socket, client: socket.socket) -> None:
        self._up, self._client = upstream, client
        self._buf = bytearray()  # read from the engine, not passed on yet
        self._queue: collections.deque[Expected] = collections.deque()
        self._cond = threading.Condition()
        self.state = HTTP
        self._busy, self._small_at = False, float("-inf")  # see _fill

    # -- the request side's half ----------------------------------------------------------------

    def expect(self, head: bool, hijacking: bool) -> Expected:
        """Note a request about to be sent on (before it is: the answer may come at once)."""
        item = Expected(head, hijacking)
        with self._cond:
            self._queue.append(item)
        return item

    def verdict(self, item: Expected) -> str:
        """Wait for the response to `item`'s request to begin; the state it leaves: RAW if
        the engine hijacked the connection."""
        item.answered.wait()
        return self.state

    def wait_idle(self, timeout: float | None = None) -> bool | None:
        """Wait until every response so far has gone out; False if the engine's side is no
        longer HTTP, so that no answer of the proxy's own may follow; None if `timeout`
        seconds passed first."""
        with self._cond:
            if not self._cond.wait_for(lambda: not self._queue or self.state != HTTP, timeout):
                return None
            return self.state == HTTP

    # -- the thread -----------------------------------------------------------------------------

    def run(self) -> None:
        try:
            try:
                while self._response():
                    pass
            except _Lost:
                self._end(ENDED)
                self._up.shutdown(socket.SHUT_WR)  # no request after this one reaches it
                self._raw(ENDED)
            self._client.shutdown(socket.SHUT_WR)
        except OSError:
            relay.cut(self._up, self._client)
        finally:
            self._end(ENDED)

    def _end(self, state: str) -> None:
        with self._cond:
            if self.state == HTTP:
                self.state = state
            for item in self._queue:
                item.answered.set()
            self._cond.notify_all()

    def _raw(self, state: str) -> None:
        """Pass everything from here on as it comes, until the engine closes."""
        self._end(state)
        self._flush(len(self._buf))
        relay.copy(self._up, self._client, None)

    def _response(self) -> bool:
        """Pass one response on; False once the engine has closed or the bytes went raw."""
        end = self._head_end()
        if end is None:
            self._flush(len(self._buf))
            return False
        status, fields = _parse_head(bytes(self._buf[:end]))
        with self._cond:
            if not self._queue:
                raise _Lost()  # a response to no request: the two sides no longer agree
            item = self._queue[0]
        if 100 <= status < 200 and status != 101:
            self._flush(end)  # an interim answer (100 Continue): the response is still to come
            return True
        raw = status == 101 or (
            status == 200
            and fields.get(b"content-type", b"").split(b";")[0].strip() in RAW_TYPES
            and b"content-length" not in fields
            and b"transfer-encoding" not in fields
        )
        if raw and (item.hijacking or status == 101):
            self._raw(RAW)
            return False
        length = None
        if b"content-length" in fields:
            # Read before the head goes on: whoever has the head has the verdict too.
            try:
                length = int(fields[b"content-length"])
            except ValueError:
                raise _Lost() from None
        item.answered.set()
        self._flush(end)
        if item.head or status in (204, 304):
            pass
        elif b"transfer-encoding" in fields:
            if fields[b"transfer-encoding"].split(b",")[-1].strip().lower() != b"chunked":
                self._raw(RAW)  # a body that ends with the connection
                return False
            self._chunked()
        elif length is not None:
            self._skip(length)
        else:
            self._raw(RAW)
            return False
        with self._cond:
            self._queue.popleft()
            self._cond.notify_all()
        return True

    # -- reading the engine's bytes -------------------------------------------------------------

    def _fill(self, streaming: bool = True) -> bool:
        """Read more from the engine into the buffer; False at its end. Waits first, so that
        an idle connection holds no read buffer. Within a body, small reads that follow
        each other closely (a log stream's lines, one chunk each) make the next read wait a
        little for more, as relay.copy does: a chunk at a time would cost a wake-up, a read
        and a write each. A head is never waited for: the next response is a request's
        answer, and that request's client waits for it."""
        poll = select.poll()
        poll.register(self._up, select.POLLIN)
        poll.poll()
        if streaming and self._busy:
            time.sleep(relay.BATCH_PAUSE)
        data = self._up.recv(CHUNK)
        self._buf += data
        self._busy = False
        if streaming and len(data) < relay.SMALL_MOVE:
            now = time.monotonic()
            self._busy = now - self._small_at < relay.BUSY_GAP
            self._small_at = now
        return bool(data)

    def _more(self, pos: int) -> int:
        """Pass the `pos` bytes read through on, then read more; the new place of what
        followed them (0)."""
        self._flush(pos)
        if not self._fill():
            raise _Lost()
        return 0

    def _flush(self, n: int) -> None:
        """Pass the buffer's first `n` bytes on to the client."""
        if n:
            self._client.sendall(memoryview(self._buf)[:n])
            del self._buf[:n]

    def _head_end(self) -> int | None:
        """The length of the response head at the start of the buffer, reading as needed;
        None if the engine closed before one began."""
        start = 0
        while True:
            at = self._buf.find(b"\r\n\r\n", start)
            if at >= 0:
                return at + 4
            if len(self._buf) > MAX_HEAD:
                raise _Lost()
            start = max(0, len(self._buf) - 3)
            if not self._fill(streaming=False):
                if self._buf:
                    raise _Lost()
                return None

    def _line_end(self, pos: int) -> tuple[int, int]:
        """(the place of the CRLF ending the line at `pos`, the line's new start), reading
        as needed."""
        while (at := self._buf.find(b"\r\n", pos)) < 0:
            if len(self._buf) - pos > MAX_LINE:
                raise _Lost()
            pos = self._more(pos)
        return at, pos

    def _skip(self, n: int) -> None:
        """Pass `n` bytes of body on: from the buffer, then straight from socket to socket."""
        while n:
            if not self._buf:
                if n >= SPLICE_FROM:
                    if relay.copy(self._up, self._client, n) < n:
                        raise _Lost()
                    return
                if not self._fill():
                    raise _Lost()
            take = min(n, len(self._buf))
            self._flush(take)
            n -= take

    def _chunked(self) -> None:
        """Pass a chunked body on, up to and with its last chunk and trailers. The chunks
        in the buffer are walked through, and passed on at once before each read."""
        pos = 0  # where the next chunk starts: what is before it is read through
        while True:
            at, pos = self._line_end(pos)
            try:
                size = int(self._buf[pos:at].split(b";")[0], 16)  # int() strips blanks
            except ValueError:
                raise _Lost() from None
            pos = at + 2
            if size == 0:
                while True:  # trailers, then an empty line
                    at, pos = self._line_end(pos)
                    empty, pos = at == pos, at + 2
                    if empty:
                        self._flush(pos)
                        return
            end = pos + size + 2  # the data, then its CRLF
            if end > len(self._buf):
                # The chunk goes on past what was read: on, then straight through.
                left = end - len(self._buf)
                self._flush(len(self._buf))
                if left - 2 >= SPLICE_FROM:
                    if relay.copy(self._up, self._client, left - 2) < left - 2:
                        raise _Lost()
                    left = 2
                while len(self._buf) < left:
                    if not self._fill():
                        raise _Lost()
                end = left
            if end >= 2 and self._buf[end - 2 : end] != b"\r\n":
                raise _Lost()
            pos = end


def _parse_head(head: bytes) -> tuple[int, dict[bytes, bytes]]:
    """The status and the header fields (names in lower case; the last of a name wins) of a
    response head. Raises _Lost for one that is not HTTP/1.x."""
    lines = head[:-4].split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise _Lost()
    fields = {}
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon:
            raise _Lost()
        fields[name.strip().lower()] = value.strip()
    return int(parts[1]), fields
