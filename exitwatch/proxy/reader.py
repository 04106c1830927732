"""The client-to-engine half of a proxied connection: requests read one at a time with h11,
and sent on as h11 read them.

Each head is written again from what h11 parsed, its body framed again (a Content-Length, or
chunks of the proxy's own), so the engine reads exactly the requests the proxy read: never a
request hidden, by a framing the two parse differently, in what the proxy took for a body.
Bodies pass raw (spliced) where their length is known, except those of creations, which are
read whole, within MAX_BODY and the proxy's Budget, to be labelled (creation.py). Heads are
bounded in all too: HEAD_FREE bytes of one on a connection's own, a longer one within one of
the Budget's HEAD_SHARES. Nothing shared is held while a request waits for the responses
before it, which may never end (GET /events): the engine reads no request meanwhile. A
request h11 cannot parse is refused and the connection closed; the client's bytes go raw
only once the engine has hijacked the connection (responses.py says when).
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
from collections.abc import Iterator

import h11

from exitwatch.contract import LABEL_OWNER_NAME
from exitwatch.proxy import creation, framing, relay, routes, volumes
from exitwatch.proxy.policy import Owned, Refuse
from exitwatch.proxy.responses import HTTP, RAW, Responses
from exitwatch.proxy.routes import Route

CHUNK = 64 * 1024  # bytes per read of a request
# Bytes of a request head that a connection reads on its own. The docker CLI's heads are
# under 1 KiB, 6 KiB with an X-Registry-Auth of a long token; a legacy build's
# X-Registry-Config, every registry's credentials, can be longer.
HEAD_FREE = 16 * 1024
MAX_HEAD = 1024 * 1024  # the engine's own limit (Go's DefaultMaxHeaderBytes)
HEAD_SHARES = 4  # heads longer than HEAD_FREE held at once, across connections
MAX_BODY = 4 * 1024 * 1024  # bytes of a creation's body; a create config is a few KiB
PER_OWNER = 2 * MAX_BODY  # bytes of creation bodies one owner's connections hold at once
TOTAL = 4 * MAX_BODY  # bytes of creation bodies held at once, across all owners
BODY_DEADLINE = 10.0  # seconds for a creation's body to begin; then, its share held, to end
DRAIN = (2.0, 8 * 1024 * 1024)  # what is read and dropped after a refusal, before closing
HANGUP_CHECK = 0.5  # seconds between looks, while a request waits, at whether its client left
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


class Budget:
    """Bytes that the connections of one proxy may hold of creation bodies at once: PER_OWNER
    for each owner's connections together, TOTAL over all. One that cannot have its share
    waits for it before it reads its body, holding nothing more; none asks for one before
    its body has begun to come. A share is held while its body arrives (BODY_DEADLINE at
    most), is labelled, and has its named volumes created, so none waits for long; and one
    owner's slow clients, which hold at most PER_OWNER, never make another owner's creations
    wait (it takes two owners' to fill TOTAL). `heads` is the like for request heads longer
    than HEAD_FREE: a share of MAX_HEAD each, held from HEAD_FREE bytes on until the request
    has gone on, its head whole within BODY_DEADLINE."""

    def __init__(self, total: int = TOTAL, per_owner: int = PER_OWNER) -> None:
        self._total, self._per_owner, self._used = total, per_owner, 0
        self._by_owner: dict[str, int] = {}
        self._cond = threading.Condition()
        self.parsing = threading.Lock()  # one body parsed at a time: the parse's own memory
        self.heads = threading.BoundedSemaphore(HEAD_SHARES)

    @contextlib.contextmanager
    def hold(self, n: int, owner: str = "") -> Iterator[None]:
        """Hold `n` bytes of `owner`'s budget (all of one share, at most) for the block."""
        n = min(n, self._total, self._per_owner)

        def fits() -> bool:
            mine = self._by_owner.get(owner, 0)
            return self._used + n <= self._total and mine + n <= self._per_owner

        with self._cond:
            self._cond.wait_for(fits)
            self._used += n
            self._by_owner[owner] = self._by_owner.get(owner, 0) + n
        try:
            yield
        finally:
            with self._cond:
                self._used -= n
                left = self._by_owner[owner] - n
                if left:
                    self._by_owner[owner] = left
                else:  # no owner is remembered once it holds nothing
                    del self._by_owner[owner]
                self._cond.notify_all()


class _Refusal(Exception):
    def __init__(self, status: int, message: str, close: bool) -> None:
        super().__init__(message)
        self.status, self.close = status, close


class _WentRaw(Exception):
    """The engine hijacked the connection while a request was being read."""


class Reader:
    """Reads the requests of `client` and sends them on to `upstream` (run()), labelling
    creations with `owner` (or refusing them); `responses` is the connection's other half."""

    def __init__(
        self,
        client: socket.socket,
        upstream: socket.socket,
        owner: Owned | Refuse,
        responses: Responses,
        engine: str,
        budget: Budget,
    ) -> None:
        self.client, self.upstream, self.owner = client, upstream, owner
        self.responses, self.engine, self.budget = responses, engine, budget
        self.pending = b""  # read from the client, not sent on yet

    def run(self) -> None:
        while self.responses.state == HTTP:
            try:
                if not self._request():
                    return
            except _Refusal as refusal:
                if not self._refuse(refusal):
                    break
            except _WentRaw:
                break  # inside a body: what was read of it is lost to the stream
        if self.responses.state == RAW:
            relay.pump(self.client, self.upstream, self.pending)

    def _request(self) -> bool:
        """Read one request and send it on; False once the client has closed."""
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
        buffered, self.pending = self.pending, b""  # h11's now, or the stream's if it goes raw
        if buffered:  # b"" would tell h11 the client closed
            conn.receive_data(buffered)
        with contextlib.ExitStack() as share:
            try:
                event = self._read_head(conn, len(buffered), share)
            except _WentRaw:
                return True
            except h11.RemoteProtocolError as err:
                raise _Refusal(
                    400, f"not a request the proxy can read: {err}", close=True
                ) from None
            if isinstance(event, h11.ConnectionClosed):
                self.upstream.shutdown(socket.SHUT_WR)
                return False
            assert isinstance(event, h11.Request)
            if event.http_version == b"1.0" and framing.content_length(event) is None:
                # Go ignores Transfer-Encoding on HTTP/1.0: it would read the chunks as requests.
                raise _Refusal(400, "an HTTP/1.0 request with a chunked body", close=True)
            try:
                found = routes.route(event.method, event.target)
            except routes.Refused as err:
                raise _Refusal(400, str(err), close=True) from None
            if found.creates or (found is Route.LEGACY_START and framing.start_body(event)):
                self._create(conn, event, found)
            else:
                self._forward(conn, event, found)
        return True

    def _read_head(
        self, conn: h11.Connection, buffered: int, share: contextlib.ExitStack
    ) -> h11.Event:
        """The request's head (or the client's close), `buffered` bytes of it in `conn` already.
        Past HEAD_FREE bytes, it first waits for the responses before it to go out, so that
        it goes on at once once read, then takes one of the budget's head shares (into
        `share`) and must be whole within BODY_DEADLINE."""
        deadline = None
        while True:
            event = conn.next_event()
            if event is not h11.NEED_DATA:
                return event
            if deadline is None and buffered >= HEAD_FREE:
                if not self._wait_idle():
                    self._not_http(conn, b"")
                share.enter_context(self.budget.heads)
                deadline = time.monotonic() + BODY_DEADLINE
            size = CHUNK if deadline is not None else HEAD_FREE - buffered
            buffered += self._receive(conn, size, deadline, "the request's head")

    def _next(self, conn: h11.Connection, deadline: float | None = None) -> h11.Event:
        """h11's next event within a body, reading as needed."""
        while True:
            event = conn.next_event()
            if event is not h11.NEED_DATA:
                return event
            self._receive(conn, CHUNK, deadline, "the creation's body")

    def _receive(self, conn: h11.Connection, size: int, deadline: float | None, what: str) -> int:
        """Read up to `size` bytes into `conn`, once the client has sent some (by `deadline`,
        else 408 for `what`); how many."""
        self._readable(deadline, what)
        data = self.client.recv(size)
        if self.responses.state == RAW:
            self._not_http(conn, data)
        conn.receive_data(data)
        return len(data)

    def _not_http(self, conn: h11.Connection, data: bytes) -> None:
        """The engine's side is HTTP no longer: `data`, and what h11 holds unread, are the
        stream's if the engine hijacked the connection (_WentRaw); else it is cut."""
        if self.responses.state == RAW:
            self.pending = conn.trailing_data[0] + data
            raise _WentRaw()
        raise ConnectionAbortedError("the engine's side is no longer HTTP")

    def _readable(self, deadline: float | None, what: str) -> None:
        """Wait until the client has sent something: recv() allocates its whole buffer
        before it blocks, and 64 idle keep-alive connections would each hold one."""
        poll = select.poll()
        poll.register(self.client, select.POLLIN)
        timeout = None if deadline is None else max(0, deadline - time.monotonic()) * 1000
        if not poll.poll(timeout):
            raise _Refusal(408, f"{what} did not come within {BODY_DEADLINE:.0f} s", close=True)

    def _wait_idle(self) -> bool:
        """Wait until every response so far has gone out; whether the engine's side is HTTP
        still. Raises ConnectionResetError once the client has hung up meanwhile: a request
        behind an endless response would otherwise wait for as long as the engine's side."""
        hangup = select.poll()
        hangup.register(self.client, 0)  # POLLHUP and POLLERR come unasked
        while (idle := self.responses.wait_idle(HANGUP_CHECK)) is None:
            if hangup.poll(0):
                raise ConnectionResetError("the client hung up while its request waited")
        return idle

    # -- creations ------------------------------------------------------------------------------

    def _create(self, conn: h11.Connection, request: h11.Request, found: Route) -> None:
        if isinstance(self.owner, Refuse):
            raise _Refusal(400, f"creations are refused here: {self.owner.reason}", close=True)
        expects = [v for n, v in request.headers if n == b"expect"]
        if len(expects) > 1:
            raise _Refusal(400, "a creation with more than one Expect header", close=True)
        answer_100 = bool(expects) and expects[0].lower() == b"100-continue"
        length = framing.content_length(request)
        if length is not None and length > MAX_BODY:
            raise _Refusal(413, _too_long(f"{length} bytes"), close=True)
        # The engine reads this request once every response before it has gone out: a share
        # taken before would be held for as long as those take (an events stream: for good).
        if not self._wait_idle():
            raise ConnectionAbortedError("the engine's side ended before the creation")
        if answer_100 and conn.client_is_waiting_for_100_continue:
            self.client.sendall(CONTINUE)
        if length != 0 and not conn.trailing_data[0]:
            # Nor before its body has begun to come (a client that asked for the 100 sends
            # it only now): this wait holds nothing shared, and is bounded too.
            self._readable(time.monotonic() + BODY_DEADLINE, "the creation's body")
        owner = self.owner
        with self.budget.hold(MAX_BODY if length is None else length, owner.owner):
            body = self._whole_body(conn, length)
            try:
                with self.budget.parsing:
                    more = {LABEL_OWNER_NAME: owner.name} if owner.name else None
                    done = creation.label(found, body, owner.owner, more)
            except creation.Refused as err:
                raise _Refusal(400, str(err), close=False) from None
            del body  # what goes on is done.body: the body that came is not held meanwhile
            for volume in done.volumes:
                problem = volumes.create(self.engine, volume)
                if problem:
                    raise _Refusal(*problem, close=False)
            sized = [(b"Content-Length", b"%d" % len(done.body))]
            drop = (b"expect",) if answer_100 else ()
            head = framing.head_again(request, request.target, sized, drop)
            self.responses.expect(False, False)
            if len(done.body) > CHUNK:  # not copied once more to join them
                self.upstream.sendall(head)
                self.upstream.sendall(done.body)
            else:
                self.upstream.sendall(head + done.body)

    def _whole_body(self, conn: h11.Connection, length: int | None) -> bytearray:
        """A creation's body, read within BODY_DEADLINE into one buffer of its size (a
        chunked one, through h11); what follows it stays pending."""
        deadline = time.monotonic() + BODY_DEADLINE
        if length is None:
            return self._chunked_body(conn, deadline)
        rest = conn.trailing_data[0]
        body = bytearray(length)
        got = min(length, len(rest))
        body[:got] = rest[:got]
        self.pending = rest[got:]
        view = memoryview(body)
        while got < length:
            self._readable(deadline, "the creation's body")
            n = self.client.recv_into(view[got:])
            if not n:
                raise ConnectionResetError("the client closed the connection inside a body")
            got += n
        return body

    def _chunked_body(self, conn: h11.Connection, deadline: float) -> bytearray:
        body = bytearray()
        while True:
            event = self._next(conn, deadline)
            if isinstance(event, h11.Data):
                body += event.data
                if len(body) > MAX_BODY:
                    raise _Refusal(413, _too_long("more"), close=True)
            elif isinstance(event, h11.EndOfMessage):
                self.pending = conn.trailing_data[0]
                return body
            else:
                raise h11.RemoteProtocolError(f"unexpected {type(event).__name__} in a body")

    # -- everything else ------------------------------------------------------------------------

    def _forward(self, conn: h11.Connection, request: h11.Request, found: Route) -> None:
        target = request.target
        if found is Route.BUILD:
            target = routes.build_target(target)
        hijacking = found in (Route.ATTACH, Route.EXEC_START) or framing.upgrades(request)
        chunked = framing.content_length(request) is None
        item = self.responses.expect(request.method == b"HEAD", hijacking)
        if chunked:
            self._chunked(conn, request, target)
        else:
            self._sized(conn, request, target)
        if hijacking:
            self.responses.verdict(item)

    def _sized(self, conn: h11.Connection, request: h11.Request, target: bytes) -> None:
        """Send a request of known length on: its head again, its body as it comes."""
        length = framing.content_length(request) or 0
        sized = [(b"Content-Length", b"%d" % length)] if framing.has_length(request) else []
        rest = conn.trailing_data[0]
        self.upstream.sendall(framing.head_again(request, target, sized) + rest[:length])
        self.pending = rest[length:]
        left = length - min(length, len(rest))
        if left and relay.copy(self.client, self.upstream, left) < left:
            raise ConnectionResetError("the client closed the connection inside a body")

    def _chunked(self, conn: h11.Connection, request: h11.Request, target: bytes) -> None:
        """Send a chunked request on, in chunks of its own: h11 found where it ends."""
        self.upstream.sendall(
            framing.head_again(request, target, [(b"Transfer-Encoding", b"chunked")])
        )
        while True:
            event = self._next(conn)
            if isinstance(event, h11.Data):
                if event.data:
                    self.upstream.sendall(b"%x\r\n%s\r\n" % (len(event.data), event.data))
            elif isinstance(event, h11.EndOfMessage):
                trailers = b"".join(n + b": " + v + b"\r\n" for n, v in event.headers.raw_items())
                self.upstream.sendall(b"0\r\n" + trailers + b"\r\n")
                self.pending = conn.trailing_data[0]
                return
            else:
                raise h11.RemoteProtocolError(f"unexpected {type(event).__name__} in a body")

    # -- the proxy's own answers ----------------------------------------------------------------

    def _refuse(self, refusal: _Refusal) -> bool:
        """Answer with `refusal` in its turn; whether the connection goes on. After a
        refusal that closes it, the engine's side is ended too."""
        if not self._wait_idle():
            return False
        self.client.sendall(framing.answer(refusal.status, str(refusal), refusal.close))
        if not refusal.close:
            return True
        with contextlib.suppress(OSError):
            self.upstream.shutdown(socket.SHUT_WR)
            self.client.shutdown(socket.SHUT_WR)
            self._drain()
        return False

    def _drain(self) -> None:
        """Read what the client still sends, so that it reads the answer before it sees the
        connection reset, and drop it; for a while at most."""
        deadline, left = time.monotonic() + DRAIN[0], DRAIN[1]
        buf = bytearray(CHUNK)
        poll = select.poll()
        poll.register(self.client, select.POLLIN)
        while left > 0 and poll.poll(max(0, deadline - time.monotonic()) * 1000):
            n = self.client.recv_into(buf)
            if not n:
                return
            left -= n


def _too_long(size: str) -> str:
    return (
        f"a creation's body of {size} is over the run's socket's limit of {MAX_BODY} bytes"
        " (docs/run.md)"
    )
