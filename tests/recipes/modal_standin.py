"""A local stand-in of Modal's gRPC API for tests/recipes/check.py, run with the modal
venv's python (grpclib and Modal's own service description are there). With NOT_FOUND, it
lets a client in (ClientHello, and AuthTokenGet with a token good for an hour) and fails
every other call so; with UNAUTHENTICATED, it fails every call so, ClientHello first. It
prints its port, then each call it gets, its name and the sandbox it names, on stdout."""

from __future__ import annotations

import asyncio
import base64
import json
import sys
import time

from grpclib.const import Handler, Status
from grpclib.exceptions import GRPCError
from grpclib.server import Server, Stream
from modal_proto import api_grpc, api_pb2

LET_IN = {"ClientHello", "AuthTokenGet"}


def token() -> str:
    """A JWT's shape, which the client decodes for its expiry (unsigned: nothing checks)."""
    claims = json.dumps({"exp": int(time.time()) + 3600}).encode()
    return "e30." + base64.urlsafe_b64encode(claims).decode().rstrip("=") + ".stand-in"


class StandIn:
    """Every method of Modal's ModalClient service, as grpclib serves them."""

    def __init__(self, status: Status) -> None:
        self.status = status

    def __mapping__(self) -> dict[str, Handler]:
        # The service's own table of paths and message types; only the functions are ours.
        real = api_grpc.ModalClientBase.__mapping__(self)  # type: ignore[arg-type]
        return {
            path: Handler(self.answer(path), h.cardinality, h.request_type, h.reply_type)
            for path, h in real.items()
        }

    def __getattr__(self, name: str) -> None:  # what ModalClientBase's table names
        return None

    def answer(self, path: str):
        name = path.rsplit("/", 1)[-1]

        async def handle(stream: Stream) -> None:
            request = await stream.recv_message()
            print(name, getattr(request, "sandbox_id", ""), flush=True)
            if self.status == Status.NOT_FOUND and name in LET_IN:
                if name == "AuthTokenGet":
                    await stream.send_message(api_pb2.AuthTokenGetResponse(token=token()))
                else:
                    await stream.send_message(api_pb2.ClientHelloResponse())
                return
            raise GRPCError(self.status, "stand-in")

        return handle


async def main(status: str) -> None:
    server = Server([StandIn(Status[status])])
    await server.start("127.0.0.1", 0)
    print(server._server.sockets[0].getsockname()[1], flush=True)
    await server.wait_closed()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
