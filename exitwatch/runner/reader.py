"""The client-to-engine half of a proxied connection: requests read one at a time with h11,
and sent on as h11 read them.

Each head is written again from what h11 parsed, its body framed again (a Content-Length, or
chunks of the proxy's own), so the engine reads exactly the requests the proxy read: never a
request hidden, by a framing the two parse differently, in what the proxy took for a body.
Bodies pass raw (spliced) where their length is known, except those of creations, which are
read whole, within MAX_BODY and the proxy's Budget, to be labelled (creation.py). A request
h11 cannot parse is refused and the connection closed; the client's bytes go raw only once
the engine has hijacked the connection (responses.py says when).
"""

from __future__ import annotations

import contextlib
import http
import json
import select
import socket
import threading
import time
from collections.abc import Iterator

import h11

from exitwatch.contract import LABEL_OWNER_NAME
from exitwatch.runner import creation, relay, routes, volumes
from exitwatch.runner.policy import Owned, Refuse
from exitwatch.runner.responses import HTTP, RAW, Responses
from exitwatch.runner.routes import Route

CHUNK = 64 * 1024  # bytes per read of a request
MAX_HEAD = 1024 * 1024  # the engine's own limit (Go's DefaultMaxHeaderBytes)
MAX_BODY = 4 * 1024 * 1024  # bytes of a creation's body; a create config is a few KiB
PER_OWNER = 2 * MAX_BODY  # bytes of creation bodies one owner's connections hold at once
TOTAL = 4 * MAX_BODY  # bytes of creation bodies held at once, across all owners
BODY_DEADLINE = 10.0  # seconds for a creation's body to arrive once its bytes are reserved
DRAIN = (2.0, 8 * 1024 * 1024)  # what is read and dropped after a refusal, before closing
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


class Budget:
    """Bytes that the connections of one proxy may hold of creation bodies at once: PER_OWNER
    for each owner's connections together, TOTAL over all. One that cannot have its share
    waits for it before it reads its body, holding nothing more. A share is held while its
    body arrives (BODY_DEADLINE at most), is labelled, and has its named volumes created,
    so none waits for long; and one owner's slow clients, which hold at most PER_OWNER,
    never make another owner's creations wait (it takes two owners' to fill TOTAL)."""

    def __init__(self, total: int = TOTAL, per_owner: int = PER_OWNER) -> None:
        self._total, self._per_owner, self._used = total, per_owner, 0
        self._by_owner: dict[str, int] = {}
        self._cond = threading.Condition()
        self.parsing = threading.Lock()  # one body parsed at a time: the parse's own memory

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
        raw = bytearray(self.pending)
        if self.pending:  # b"" would tell h11 the client closed
            conn.receive_data(self.pending)
        try:
            event = self._next(conn, raw)
        except _WentRaw:
            self.pending = bytes(raw)
            return True
        except h11.RemoteProtocolError as err:
            raise _Refusal(400, f"not a request the proxy can read: {err}", close=True) from None
        if isinstance(event, h11.ConnectionClosed):
            self.upstream.shutdown(socket.SHUT_WR)
            return False
        assert isinstance(event, h11.Request)
        try:
            found = routes.route(event.method, event.target)
        except routes.Refused as err:
            raise _Refusal(400, str(err), close=True) from None
        if found.creates:
            self._create(conn, event, found)
        else:
            self._forward(conn, event, found)
        return True

    def _next(
        self, conn: h11.Connection, raw: bytearray | None = None, deadline: float | None = None
    ) -> h11.Event:
        """h11's next event, reading as needed (into `raw` too, if given)."""
        while True:
            event = conn.next_event()
            if event is not h11.NEED_DATA:
                return event
            self._readable(deadline)
            data = self.client.recv(CHUNK)
            if raw is not None:
                raw += data
            if self.responses.state == RAW:
                raise _WentRaw()  # these bytes are the stream's, not a request's
            conn.receive_data(data)

    def _readable(self, deadline: float | None) -> None:
        """Wait until the client has sent something: recv() allocates its whole buffer
        before it blocks, and 64 idle keep-alive connections would each hold one."""
        poll = select.poll()
        poll.register(self.client, select.POLLIN)
        timeout = None if deadline is None else max(0, deadline - time.monotonic()) * 1000
        if not poll.poll(timeout):
            raise _Refusal(
                408, f"the creation's body did not come within {BODY_DEADLINE:.0f} s", close=True
            )

    # -- creations ------------------------------------------------------------------------------

    def _create(self, conn: h11.Connection, request: h11.Request, found: Route) -> None:
        if isinstance(self.owner, Refuse):
            raise _Refusal(400, f"creations are refused here: {self.owner.reason}", close=True)
        expects = [v for n, v in request.headers if n == b"expect"]
        if len(expects) > 1:
            raise _Refusal(400, "a creation with more than one Expect header", close=True)
        answer_100 = bool(expects) and expects[0].lower() == b"100-continue"
        length = _content_length(request)
        if length is not None and length > MAX_BODY:
            raise _Refusal(413, _too_long(f"{length} bytes"), close=True)
        owner = self.owner
        with self.budget.hold(MAX_BODY if length is None else length, owner.owner):
            if answer_100 and conn.client_is_waiting_for_100_continue:
                if not self.responses.wait_idle():
                    raise ConnectionAbortedError("the engine's side ended before the 100")
                self.client.sendall(CONTINUE)
            body = self._whole_body(conn, length)
            try:
                with self.budget.parsing:
                    more = {LABEL_OWNER_NAME: owner.name} if owner.name else None
                    done = creation.label(found, body, owner.owner, more)
            except creation.Refused as err:
                raise _Refusal(400, str(err), close=False) from None
            for volume in done.volumes:
                problem = volumes.create(self.engine, volume)
                if problem:
                    raise _Refusal(*problem, close=False)
            framing = [(b"Content-Length", b"%d" % len(done.body))]
            drop = (b"expect",) if answer_100 else ()
            head = _head(request, request.target, framing, drop)
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
            self._readable(deadline)
            n = self.client.recv_into(view[got:])
            if not n:
                raise ConnectionResetError("the client closed the connection inside a body")
            got += n
        return body

    def _chunked_body(self, conn: h11.Connection, deadline: float) -> bytearray:
        body = bytearray()
        while True:
            event = self._next(conn, None, deadline)
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
        hijacking = found in (Route.ATTACH, Route.EXEC_START) or _upgrades(request)
        chunked = _content_length(request) is None
        item = self.responses.expect(request.method == b"HEAD", hijacking)
        if chunked:
            self._chunked(conn, request, target)
        else:
            self._sized(conn, request, target)
        if hijacking:
            self.responses.verdict(item)

    def _sized(self, conn: h11.Connection, request: h11.Request, target: bytes) -> None:
        """Send a request of known length on: its head again, its body as it comes."""
        length = _content_length(request) or 0
        framing = [(b"Content-Length", b"%d" % length)] if _has_length(request) else []
        rest = conn.trailing_data[0]
        self.upstream.sendall(_head(request, target, framing) + rest[:length])
        self.pending = rest[length:]
        left = length - min(length, len(rest))
        if left and relay.copy(self.client, self.upstream, left) < left:
            raise ConnectionResetError("the client closed the connection inside a body")

    def _chunked(self, conn: h11.Connection, request: h11.Request, target: bytes) -> None:
        """Send a chunked request on, in chunks of its own: h11 found where it ends."""
        self.upstream.sendall(_head(request, target, [(b"Transfer-Encoding", b"chunked")]))
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
        if not self.responses.wait_idle():
            return False
        self.client.sendall(_answer(refusal.status, str(refusal), refusal.close))
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


def _content_length(request: h11.Request) -> int | None:
    """The body's length, None for a chunked body (h11 has checked the framing)."""
    if any(name == b"transfer-encoding" for name, _ in request.headers):
        return None
    for name, value in request.headers:
        if name == b"content-length":
            return int(value)
    return 0


def _has_length(request: h11.Request) -> bool:
    return any(name == b"content-length" for name, _ in request.headers)


def _upgrades(request: h11.Request) -> bool:
    for name, value in request.headers:
        if name == b"upgrade":
            return True
        if name == b"connection" and b"upgrade" in (t.strip().lower() for t in value.split(b",")):
            return True
    return False


def _head(
    request: h11.Request,
    target: bytes,
    framing: list[tuple[bytes, bytes]],
    drop: tuple[bytes, ...] = (),
) -> bytes:
    """The head of `request` again, for `target`, its framing now `framing`."""
    lines = [b"%s %s HTTP/%s" % (request.method, target, request.http_version)]
    for name, value in request.headers.raw_items():
        if name.lower() not in (b"content-length", b"transfer-encoding", *drop):
            lines.append(name + b": " + value)
    lines += [name + b": " + value for name, value in framing]
    return b"\r\n".join(lines) + b"\r\n\r\n"


def _answer(status: int, message: str, close: bool) -> bytes:
    """An error answer like the engine's own, which the docker CLI prints."""
    body = json.dumps({"message": f"exitwatch: {message}"}).encode() + b"\n"
    try:
        reason = http.HTTPStatus(status).phrase
    except ValueError:  # a status of the engine's own making
        reason = "Error"
    head = (
        f"HTTP/1.1 {status} {reason}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        + ("Connection: close\r\n" if close else "")
    )
    return head.encode() + b"\r\n" + body


def _too_long(size: str) -> str:
    return (
        f"a creation's body of {size} is over the run's socket's limit of {MAX_BODY} bytes"
        " (docs/run.md)"
    )
