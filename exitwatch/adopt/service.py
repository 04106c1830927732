"""`exitwatch adopt`: one labelling Docker socket for the whole host.

It is the proxy of `exitwatch run` (proxy/server.py) with another policy: each connection's
owner is found from the process at its other end (peers.py), and is labelled on what that
connection creates; the agent reaps it by that label, as any owner's. The socket (its
activation by systemd, its file and its mode) is listening.py's.
"""

from __future__ import annotations

import contextlib
import logging
import resource
import threading
from collections.abc import MutableMapping
from dataclasses import dataclass

from exitwatch import procfs
from exitwatch.adopt.listening import (
    ListenError,
    Listening,
    activated,
    align,
    bind_fresh,
    open_activated,
)
from exitwatch.adopt.peers import Adopting
from exitwatch.contract import ADOPT_OWNER, LABEL_ADOPT
from exitwatch.engine.url import Endpoint
from exitwatch.proxy.server import Proxy

log = logging.getLogger(__name__)

ALIGN_EVERY = 5.0  # seconds between two looks at the engine socket's owner, group and mode


class AdoptError(Exception):
    """exitwatch adopt cannot serve; the message is one line."""


@dataclass(frozen=True)
class Settings:
    listen: str  # the socket to bind, when systemd passes none
    engine: Endpoint  # the engine forwarded to
    rules: tuple[str, ...]  # fnmatch patterns of owners' command lines
    containers: tuple[str, ...] = ()  # fnmatch patterns of owner containers' names or images


def serve(settings: Settings, stop: threading.Event, env: MutableMapping[str, str]) -> None:
    """Serve until `stop` is set. Raises AdoptError, before serving, when it cannot."""
    foreign = procfs.foreign_namespace("pid", "time")
    if foreign is not None:
        raise AdoptError(
            f"exitwatch adopt must run in the host's {foreign} namespace (inside a container? "
            "run it on the host): owners are named by their host pids and start times"
        )
    _more_files()
    listening = _listening(settings, env)
    try:
        _not_itself(listening, settings.engine)
        said: set[str] = set()
        _align(listening, settings.engine, said, starting=True)
        policy = Adopting(settings.rules, settings.engine, containers=settings.containers)
        proxy = Proxy(listening.sock, settings.engine, policy)
        proxy.start()
        how = "passed by systemd" if listening.activated else "bound"
        rules = ", ".join(repr(r) for r in settings.rules) or "none"
        owners = ", ".join(repr(c) for c in settings.containers) or "none"
        log.info(
            "ready: serving %s (%s) for the engine at %s; rules: %s; owner containers: "
            "labelled %s=%s, or named or of an image as %s",
            listening.path,
            how,
            settings.engine.where,
            rules,
            LABEL_ADOPT,
            ADOPT_OWNER,
            owners,
        )
        try:
            while not stop.wait(ALIGN_EVERY):
                _align(listening, settings.engine, said, starting=False)
        finally:
            proxy.stop()
    finally:
        listening.close()
    log.info("stopped")


def _more_files() -> None:
    """Raise the soft limit of open files to the hard one: a connection holds six
    descriptors (the client's, the engine's, a pipe for each direction while it streams),
    and 256 clients at once would pass the usual soft limit of 1024. Under systemd,
    LimitNOFILE= sets both. The proxy bounds its connections below the limit in effect
    (proxy/limits.py)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        with contextlib.suppress(OSError, ValueError):  # a filter that denies setrlimit
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _listening(settings: Settings, env: MutableMapping[str, str]) -> Listening:
    try:
        sock = activated(env)
        if sock is None:
            return bind_fresh(settings.listen)
        found = open_activated(sock)
    except ListenError as err:
        raise AdoptError(str(err)) from None
    if found.path != settings.listen:
        log.info("systemd passed %s; listen (%s) is not used", found.path, settings.listen)
    return found


def _not_itself(listening: Listening, engine: Endpoint) -> None:
    """Refuse to forward to the socket being served: every request would loop."""
    try:
        st = engine.stat()
    except OSError:
        return  # no engine now: its clients see their connections closed, as without us
    if (st.st_dev, st.st_ino) == listening.ino:
        listening.close()
        raise AdoptError(
            f"the engine socket {engine.where} is the socket served: it would loop; name the "
            "engine's own socket ([adopt] docker_host, or --docker-host)"
        )


def _align(listening: Listening, engine: Endpoint, said: set[str], starting: bool) -> None:
    """The engine socket's owner, group and mode on ours; said when it changes. Without an
    engine socket to look at, ours stays as it is (nothing can reach the engine through
    it meanwhile). What fails once serving is logged once, and serving goes on."""
    try:
        changed = align(listening, engine)
    except OSError as err:
        log.debug("engine socket %s: %s; %s stays as it is", engine.where, err, listening.path)
        return
    except ListenError as err:
        if starting:
            raise AdoptError(str(err)) from None
        if str(err) not in said:
            said.add(str(err))
            log.error("%s", err)
        return
    if changed:
        log.info("%s", changed)
