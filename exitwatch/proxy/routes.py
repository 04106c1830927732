"""Which of the engine's handlers a request reaches, read as the engine reads it: Go's
net/http parses the request target (url.ParseRequestURI: an optional scheme and authority,
the query cut off at the first "?", the path percent-decoded), and moby's router, a
gorilla/mux Router, redirects a path that path.Clean would change and otherwise matches
its routes against the decoded path, each route both bare and behind a "/v{version:[0-9.]+}"
prefix. A target the proxy reads otherwise than the engine would be a creation passed on
unlabelled, so this module follows that code step by step.

Podman serves the same routes (its Docker API), and its own, libpod's, under /libpod/, each
behind a "/v{version:[0-9][0-9A-Za-z.-]*}" prefix (pkg/api/server/handler_api.go,
VersionedPath; 4.3 and 5.4 alike): so a prefix is read as either engine's, whichever
matches more, and a route matched that the engine behind does not serve is only a 404.
Podman's router matches the path as it came, still escaped (UseEncodedPath): a route of
its matches only a path without escapes, which reads the same decoded, so matching the
decoded path as moby does finds every creation of both.
"""

from __future__ import annotations

import enum
import re
from urllib.parse import unquote_plus, unquote_to_bytes

# moby's [0-9.]+ and podman's [0-9][0-9A-Za-z.-]* together.
_VERSION = r"(?:/v[0-9.][0-9A-Za-z.-]*)?"
_BAD_ESCAPE = re.compile(r"%(?![0-9a-fA-F]{2})")  # a "%" that does not start an escape
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")


class Route(enum.Enum):
    CONTAINER_CREATE = "container"
    NETWORK_CREATE = "network"
    VOLUME_CREATE = "volume"
    BUILD = "build"
    ATTACH = "attach"
    EXEC_START = "exec start"
    # A container start under API version < 1.24, whose body the engine reads as a
    # HostConfig: its named volumes are made then (moby's postContainersStart).
    LEGACY_START = "legacy container start"
    # Podman's own (libpod) API: its bodies name their fields otherwise (creation.py).
    POD_CONTAINER_CREATE = "podman container"
    POD_CREATE = "podman pod"
    POD_NETWORK_CREATE = "podman network"
    POD_VOLUME_CREATE = "podman volume"
    OTHER = "other"

    @property
    def creates(self) -> bool:
        return self in _CREATES


_CREATES = {
    Route.CONTAINER_CREATE,
    Route.NETWORK_CREATE,
    Route.VOLUME_CREATE,
    Route.POD_CONTAINER_CREATE,
    Route.POD_CREATE,
    Route.POD_NETWORK_CREATE,
    Route.POD_VOLUME_CREATE,
}


# moby's routes for POST that matter here; `.*` is the router's {name:.*}, which, as in Go's
# regexp, does not match a newline.
_POST_ROUTES = [
    (re.compile(_VERSION + r"/containers/create"), Route.CONTAINER_CREATE),
    (re.compile(_VERSION + r"/libpod/containers/create"), Route.POD_CONTAINER_CREATE),
    (re.compile(_VERSION + r"/libpod/pods/create"), Route.POD_CREATE),
    (re.compile(_VERSION + r"/libpod/networks/create"), Route.POD_NETWORK_CREATE),
    (re.compile(_VERSION + r"/libpod/volumes/create"), Route.POD_VOLUME_CREATE),
    (re.compile(_VERSION + r"/libpod/build"), Route.BUILD),
    (re.compile(_VERSION + r"/libpod/containers/.*/attach"), Route.ATTACH),
    (re.compile(_VERSION + r"/libpod/exec/.*/start"), Route.EXEC_START),
    (re.compile(_VERSION + r"/networks/create"), Route.NETWORK_CREATE),
    (re.compile(_VERSION + r"/volumes/create"), Route.VOLUME_CREATE),
    (re.compile(_VERSION + r"/build"), Route.BUILD),
    (re.compile(_VERSION + r"/containers/.*/attach"), Route.ATTACH),
    (re.compile(_VERSION + r"/exec/.*/start"), Route.EXEC_START),
    (re.compile(r"(?:/v(?P<version>[0-9.]+))?/containers/.*/start"), Route.LEGACY_START),
]
NO_START_BODY = (1, 24)  # the API version from which a container start reads no body

# Podman's creations that cannot be labelled, refused with what to do instead.
_KUBE = (
    "podman kube play is refused here: its pods, containers and volumes are made from a "
    "YAML stream the proxy does not rewrite, and would carry no owner; create them with "
    "podman pod create and podman run (or podman create), which are labelled"
)
_REFUSED = [
    (re.compile(_VERSION + r"/libpod/(?:play/kube|kube/play)"), _KUBE),
    # 5.x: deploys to a Kubernetes cluster, whose resources no agent here follows.
    (re.compile(_VERSION + r"/libpod/kube/apply"), "podman kube apply is refused here"),
]
# A restore that imports an archive creates a container with the archive's labels. Its
# `import` is a bool as gorilla/schema reads one; these, and none, read as false (the CLI
# sends `name=` with every restore: only an import uses it).
_RESTORE = re.compile(_VERSION + r"/libpod/containers/.*/restore")
_NOT_TRUE = {"", "0", "f", "F", "false", "FALSE", "False"}


class Refused(Exception):
    """The proxy cannot be sure how the engine reads this target; the message is one line."""


def route(method: bytes, target: bytes) -> Route:
    """The handler that the engine runs for `method` and `target` (as h11 gives them: visible
    ASCII). Raises Refused for a target that the engine would refuse, or redirect to one of
    the routes above: a client that follows the redirect sends a request of its own, but an
    engine that cleaned the path instead would run the handler."""
    path = request_path(target.decode("ascii"))
    if path is None:
        raise Refused(f"the request target {_shown(target)} is not one the engine can read")
    clean = clean_path(path)
    if method != b"POST":
        return Route.OTHER
    _refused(clean, target)
    found = _match(clean)
    if clean != path and found is not Route.OTHER:
        raise Refused(
            f"the request target {_shown(target)} reaches {found.value} only once cleaned: "
            f"send {_shown(clean.encode('latin-1'))} instead"
        )
    return found


def _refused(path: str, target: bytes) -> None:
    """Raises Refused for a creation of podman's that cannot be labelled (`path`, cleaned:
    one that needs cleaning is refused anyway, or redirected by the engine)."""
    for pattern, why in _REFUSED:
        if pattern.fullmatch(path):
            raise Refused(why)
    if _RESTORE.fullmatch(path):
        query = target.decode("latin-1").partition("?")[2]
        # Go's url.ParseQuery splits at "&"; gorilla/schema matches keys without case, and
        # of several values reads one, in no set order: any true one may be it.
        pairs = (p.partition("=") for p in query.split("&"))
        if any(
            unquote_plus(k).lower() == "import" and unquote_plus(v) not in _NOT_TRUE
            for k, _, v in pairs
        ):
            raise Refused(
                "podman container restore --import is refused here: the container it makes "
                "takes the archive's labels, not the run's owner; restore it where no "
                "exitwatch socket stands between, or create the container anew"
            )


def _match(path: str) -> Route:
    for pattern, found in _POST_ROUTES:
        if matched := pattern.fullmatch(path):
            if found is Route.LEGACY_START and not _old(matched["version"]):
                return Route.OTHER
            return found
    return Route.OTHER


def _old(version: str | None) -> bool:
    """Whether the API `version` of a path's prefix is before NO_START_BODY, as moby's
    versions.LessThan compares them: the numbers between dots, a missing or empty one as 0.
    No prefix is the engine's current version."""
    if version is None:
        return False
    numbers = [int(n) if n else 0 for n in version.split(".")]
    width = max(len(numbers), len(NO_START_BODY))
    return (*numbers, *[0] * (width - len(numbers))) < (
        *NO_START_BODY,
        *[0] * (width - len(NO_START_BODY)),
    )


def request_path(target: str) -> str | None:
    """req.URL.Path as Go's url.ParseRequestURI makes it from `target` (its bytes as latin-1
    characters), or None where Go refuses the target."""
    if target == "*":
        return "*"
    scheme = _SCHEME.match(target)
    rest = target[scheme.end() :] if scheme else target
    rest = rest.split("?", 1)[0]
    if not rest.startswith("/"):
        return "" if scheme else None  # with a scheme, the rest is opaque: no path at all
    if scheme and rest.startswith("//"):
        authority_end = rest.find("/", 2)
        rest = rest[authority_end:] if authority_end >= 0 else ""
    if _BAD_ESCAPE.search(rest):
        return None  # Go: invalid URL escape
    return unquote_to_bytes(rest).decode("latin-1")


def clean_path(path: str) -> str:
    """gorilla/mux's cleanPath: Go's path.Clean of the rooted path, its trailing slash kept."""
    if not path:
        return "/"
    if not path.startswith("/"):
        path = "/" + path
    parts: list[str] = []
    for seg in path.split("/"):
        if seg == "..":
            if parts:
                parts.pop()
        elif seg not in ("", "."):
            parts.append(seg)
    clean = "/" + "/".join(parts)
    if path.endswith("/") and clean != "/":
        clean += "/"
    return clean


def build_target(target: bytes) -> bytes:
    """`target` of a POST /build with forcerm=1 first in its query, so that the legacy
    builder removes its intermediate containers always, a failed step's and an interrupted
    build's included, whatever `rm` the client sent (docker-py sends rm=False by default):
    the build API labels only the image, so a container it kept would have no owner;
    forcerm implies rm. A forcerm of the client's own is dropped: moby reads the first
    value of the key "forcerm", but podman (gorilla/schema) the last, of any key that
    folds to it, in no set order."""
    path, sep, query = target.partition(b"?")
    kept = [p for p in query.split(b"&") if not _forcerm(p)] if sep else []
    return path + b"?forcerm=1" + b"".join(b"&" + p for p in kept)


def _forcerm(part: bytes) -> bool:
    """Whether a query's `part` sets forcerm as either engine reads its key (decoded)."""
    key = part.split(b"=", 1)[0].decode("latin-1")
    return unquote_plus(key, encoding="latin-1").lower() == "forcerm"


def _shown(target: bytes) -> str:
    text = target.decode("latin-1")
    return repr(text if len(text) <= 200 else text[:200] + "...")
