"""Whose a proxied connection's creations are: the one thing that tells one use of the
labelling socket from another. `exitwatch run` labels every connection with the run's
owner (Always); `exitwatch adopt` (adopt/peers.py) finds each client's owner from its
credentials, passes an owner-less client through untouched, and refuses the creations of a
client whose owner it could not find.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Protocol


class Refuse:
    """The owner of a connection cannot be known: its creations are refused, with
    `reason` (one line) in the error answer; every other request passes."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


@dataclass(frozen=True)
class Owned:
    """An owner string to label with, and what the owner is, for people ("container
    runner-1"; "" for nothing to say), which goes on the label exitwatch.owner-name."""

    owner: str
    name: str = ""


# What a policy answers: an owner (a bare string: one with nothing more to say), or None:
# the connection is nobody's and passes through untouched.
Owner = str | Owned | None | Refuse


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
