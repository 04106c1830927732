"""docs/adopt.md's recipes as written, read from the page itself (recipes.py types them): so
that a fix of the page is what the rig runs, not a copy of it that goes stale.

A recipe's fenced blocks are of two sorts: a block whose first line is a comment naming a
path (`# /etc/environment: ...`) holds that file's text, and further `# /path` lines in
the same block start further files; any other `sh` block holds commands, one a line (a
trailing backslash continues one). Where a recipe has no block of commands, the `systemctl`
commands quoted inline in its prose are its commands."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

PATH_COMMENT = re.compile(r"^# (/[^\s:]+)")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


@dataclass
class Recipe:
    title: str
    files: list[tuple[str, str]] = field(default_factory=list)  # (path, text), in order
    commands: list[str] = field(default_factory=list)

    def file(self, suffix: str) -> str | None:
        for path, text in self.files:
            if path.endswith(suffix):
                return text
        return None


def recipe(page: str, number: int) -> Recipe:
    match = re.search(rf"^## Recipe {number}\b.*?(?=^## |\Z)", page, re.S | re.M)
    if not match:
        raise ValueError(f"docs/adopt.md has no '## Recipe {number}'")
    section = match.group(0)
    found = Recipe(title=section.splitlines()[0][3:])
    for lang, body in FENCE.findall(section):
        lines = body.splitlines()
        if lines and PATH_COMMENT.match(lines[0]):
            found.files += _files(lines)
        elif lang in ("sh", "bash", ""):
            found.commands += _commands(body)
    if not found.commands:
        prose = FENCE.sub("", section)
        found.commands = re.findall(r"`(systemctl [^`]+)`", prose)
    return found


def _files(lines: list[str]) -> list[tuple[str, str]]:
    files: list[tuple[str, list[str]]] = []
    for line in lines:
        named = PATH_COMMENT.match(line)
        if named:
            files.append((named.group(1), []))
        else:
            files[-1][1].append(line)
    return [(path, "\n".join(body).strip() + "\n") for path, body in files]


def _commands(body: str) -> list[str]:
    joined = body.replace("\\\n", " ")
    return [
        " ".join(line.split())
        for line in joined.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
