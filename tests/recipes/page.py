"""docs/hooks.md's remote-sandbox section, as tests/recipes/ reads it: each provider's
subsection, its fenced python blocks (the creation, then the hook and the lease) and the
versions it names; and this checkout's exitwatch, which runs those blocks."""

from __future__ import annotations

import os
import re
import sys
import types
from dataclasses import dataclass

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGE = os.path.join(REPO, "docs", "hooks.md")
SECTION = "## Remote sandboxes: delete on death, lease, provider timer"
BUILD = os.path.join(REPO, "build", "recipes")
FENCE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
SANDBOX_ID = "sbx-recipe-check"
BOGUS = "bogus-recipe-check-key"


@dataclass(frozen=True)
class Provider:
    heading: str  # the page's "### " subsection
    packages: tuple[str, ...]  # PyPI names; the version pinned is the one the page names
    creds: tuple[str, ...]  # the environment variables its recipe reads
    url_env: str = ""  # where its SDK takes the API's address: the stand-in's goes there
    url_path: str = ""  # the path the SDK expects under that address
    grpc: bool = False  # its API is gRPC: tests/recipes/modal_standin.py stands in for it


PROVIDERS = {
    "daytona": Provider("Daytona", ("daytona",), ("DAYTONA_API_KEY",), "DAYTONA_API_URL", "/api"),
    "e2b": Provider("E2B", ("e2b",), ("E2B_API_KEY",), "E2B_API_URL"),
    "modal": Provider(
        "Modal", ("modal",), ("MODAL_TOKEN_ID", "MODAL_TOKEN_SECRET"), "MODAL_SERVER_URL", grpc=True
    ),
    "prime": Provider(
        "Prime Intellect", ("prime-sandboxes", "prime"), ("PRIME_API_KEY",), "PRIME_API_BASE_URL"
    ),
}


def section(page: str, heading: str) -> str:
    start = page.index(SECTION)
    body = page[start:]
    end = re.search(r"^## ", body[len(SECTION) :], re.M)
    body = body[: len(SECTION) + end.start()] if end else body
    match = re.search(rf"^### {re.escape(heading)}\n(.*?)(?=^### |\Z)", body, re.S | re.M)
    if not match:
        raise SystemExit(f"docs/hooks.md: no '### {heading}' under '{SECTION}'")
    return match.group(1)


def read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        return ""


def blocks(heading: str) -> list[str]:
    return FENCE.findall(section(read(PAGE), heading))


def pinned(provider: Provider) -> list[str]:
    """package==version for each package, as the page's subsection names them."""
    text = section(read(PAGE), provider.heading)
    pins = []
    for package in provider.packages:
        match = re.search(rf"`{re.escape(package)}` (\d[\w.]*)", text)
        if not match:
            raise SystemExit(f"docs/hooks.md, {provider.heading}: no version named for `{package}`")
        pins.append(f"{package}=={match.group(1)}")
    return pins


def this_exitwatch() -> tuple[types.ModuleType, list[str]]:
    """This checkout's exitwatch (the stdlib is all it imports), and what had to be taken
    from where: the lease API is exitwatch.alive's until the package exports it."""
    sys.path.insert(0, REPO)
    import exitwatch
    import exitwatch.alive

    notes = []
    for api in ("while_alive", "cancel_lease"):
        if not hasattr(exitwatch, api):
            setattr(exitwatch, api, getattr(exitwatch.alive, api))
            notes.append(f"exitwatch.{api} taken from exitwatch.alive (not exported)")
    return exitwatch, notes
