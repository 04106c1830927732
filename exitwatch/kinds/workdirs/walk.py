"""Walking and emptying directory trees as root, one directory descriptor per level, through
fsops' openers: nothing is followed through a symlink or across a mount. tree.py walks the
roots with walk_dirs; kind.py empties a dead owner's workdir with empty_dir.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import stat
from collections.abc import Callable, Iterator

from exitwatch.kinds import fsops
from exitwatch.kinds.fsops import printable

log = logging.getLogger(__name__)

# visit(at, name, path, depth): the directory `name` in the open directory `at` ("." for
# `at` itself); True to walk below it, False (or None for ".") not to, and None for a
# subdirectory it cannot judge from its parent.
Visit = Callable[[int, str, str, int], bool | None]


def walk_dirs(
    fd: int,
    path: str,
    depth: int,
    limit: int,
    visit: Visit,
    watch: Callable[[int, str, int], None] | None = None,
) -> None:
    """Visit the open directory `fd`, which is `path` at `depth`, and its subdirectories
    down to depth `limit`, below those for which visit returns True. Closes `fd`.

    Without `watch`, a subdirectory is visited from its parent first. It is opened only
    when that visit returns None, and then visited as ".", open; or when it returns True,
    to be walked. Most workdirs are never opened: their marker says there is nothing to
    walk below them.
    With `watch`, each directory is opened and watched (watch(fd, path, depth)) before it
    is visited as "." and read, so nothing created meanwhile goes unseen.

    Symlinks, mount points and entries that vanish are skipped, and so, with a warning,
    is a directory that cannot be opened (EACCES from a FUSE mount of another user's,
    say). A TRANSIENT error (a full fd table) raises: what was not walked must not read
    as empty. At most one fd per level is open at a time.
    """
    open_subdir = fsops.subdir_opener()
    # (fd, its path with a trailing slash, its depth, its entries still to look at)
    stack: list[tuple[int, str, int, Iterator[os.DirEntry[str]]]] = []
    try:
        if watch is not None:
            watch(fd, path, depth)
        below = visit(fd, ".", path, depth)
        while True:
            if below and depth < limit:
                prefix = path if path.endswith("/") else path + "/"
                stack.append((fd, prefix, depth, os.scandir(fd)))
            else:
                os.close(fd)
            fd = -1
            while stack and fd < 0:
                parent, prefix, pdepth, entries = stack[-1]
                for entry in entries:
                    # d_type from the listing: no stat for what is not a directory
                    if not entry.is_dir(follow_symlinks=False):
                        continue
                    path, depth = prefix + entry.name, pdepth + 1
                    below = None if watch is not None else visit(parent, entry.name, path, depth)
                    if below is False or (below and depth >= limit):
                        continue
                    try:
                        fd = open_subdir(parent, entry.name)
                    except OSError as err:
                        if err.errno in fsops.TRANSIENT:
                            raise
                        if err.errno not in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR, errno.EXDEV):
                            why = err.strerror
                            log.warning("cannot open directory %s: %s", printable(path), why)
                        continue
                    if below is None:
                        if watch is not None:
                            watch(fd, path, depth)
                        below = visit(fd, ".", path, depth)
                    break
                else:
                    entries.close()
                    os.close(parent)
                    stack.pop()
            if fd < 0:
                return
    finally:
        if fd >= 0:
            os.close(fd)
        for parent, _, _, entries in stack:
            entries.close()
            os.close(parent)


Left = tuple[str, str, bool]  # path below the emptied directory, why it stayed, on purpose


def empty_dir(top: int, spare: Callable[[int], str | None], keep: str) -> list[Left]:
    """Remove everything below the open directory `top` except its entry `keep`.

    Never follows a symlink and never enters another mount; `spare(fd)` may keep a
    subdirectory by saying why (an OSError it raises leaves it too, to be tried again).
    Returns what was left. An explicit stack with one open fd at a time: going back up
    opens '..' and checks it is the directory we came from, so no depth exhausts the Python
    stack or the fd table. Each level keeps only its own name: a path is built for a
    message alone, so memory grows with the depth, not with its square.
    """
    left: list[Left] = []
    fd = os.dup(top)
    try:
        names = [n for n in os.listdir(fd) if n != keep]
        # (name of this level, its stat, entries still to do, len(left) on entering it)
        stack: list[tuple[str, os.stat_result, list[str], int]] = [("", os.fstat(fd), names, 0)]

        def rel(name: str | None = None) -> str:
            parts = [level[0] for level in stack[1:]]
            return "/".join(parts if name is None else [*parts, name])

        while stack:
            _, _, names, left_before = stack[-1]
            if names:
                name = names.pop()
                sub = _step(fd, name, functools.partial(rel, name), spare, left)
                if sub is not None:
                    os.close(fd)
                    fd = sub[0]
                    stack.append((name, sub[1], sub[2], len(left)))
                continue
            if len(stack) == 1:
                break
            up = open_parent(fd)
            ust, want = os.fstat(up), stack[-2][1]
            if (ust.st_dev, ust.st_ino) != (want.st_dev, want.st_ino):
                os.close(up)
                left.append((rel(), "it was moved away during removal; stopped there", True))
                break
            os.close(fd)
            fd = up
            name = stack[-1][0]
            try:
                os.rmdir(name, dir_fd=fd)
            except FileNotFoundError:
                pass
            except OSError as err:
                # Not empty because of something already reported: say it once.
                if err.errno != errno.ENOTEMPTY or len(left) == left_before:
                    left.append((rel(), err.strerror or str(err), False))
            stack.pop()
    finally:
        os.close(fd)
    return left


def _step(
    fd: int,
    name: str,
    rel: Callable[[], str],
    spare: Callable[[int], str | None],
    left: list[Left],
) -> tuple[int, os.stat_result, list[str]] | None:
    """Unlink entry `name` of `fd`, or open it when it is a directory to descend into;
    `rel()` is its path below the emptied directory, for messages."""
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        if not stat.S_ISDIR(st.st_mode):
            # Unlinking a symlink or a hard link never touches the target's content.
            os.unlink(name, dir_fd=fd)
            return None
        child = fsops.open_dir(fd, name)
    except FileNotFoundError:
        return None
    except OSError as err:
        if err.errno == errno.EXDEV:
            left.append((rel(), "a mount point or on another filesystem", True))
        elif err.errno in (errno.ELOOP, errno.ENOTDIR, errno.EISDIR):
            left.append((rel(), "it changed during removal", True))
        else:
            left.append((rel(), err.strerror or str(err), False))
        return None
    try:
        cst = os.fstat(child)
        if (cst.st_dev, cst.st_ino) != (st.st_dev, st.st_ino):
            left.append((rel(), "it changed during removal", True))
        elif (why := spare(child)) is not None:
            left.append((rel(), why, True))
        else:
            return child, cst, os.listdir(child)
    except OSError as err:
        left.append((rel(), err.strerror or str(err), False))
    os.close(child)
    return None


def open_parent(fd: int) -> int:
    """Open '..' of `fd`. The caller must check it is the directory it came from."""
    # RESOLVE_BENEATH forbids '..', so this is a plain openat.
    return os.open("..", fsops.DIR_FLAGS, dir_fd=fd)
