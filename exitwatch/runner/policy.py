"""Whose a proxied connection's creations are: the one thing that tells one use of the
labelling socket from another. `exitwatch run` labels every connection with the run's
owner (Always); a socket for a whole host would find each client's owner from its
credentials, pass an owner-less client through untouched, and refuse the creations of a
client whose owner it could not find.
"""

from __future__ import annotations

import socket
from typing import Protocol


class Refuse:
    """The owner of a connection cannot be known: its creations are refused, with
    `reason` (one line) in the error answer; every other request passes."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


Owner = str | None | Refuse  # an owner string to label with; None: pass the connection through


class Policy(Protocol):
    def owner_for(self, client: socket.socket) -> Owner:
        """The owner of the connection `client`, asked once, when it is accepted."""
        ...


class Always:
    """Every connection is `owner`'s."""

    def __init__(self, owner: str) -> None:
        self.owner = owner

    def owner_for(self, client: socket.socket) -> Owner:
        return self.owner
