"""Engines found on the host (engine/host.py), and how a found one is reached
(url.Endpoint.owned): only a socket that is its user's own, through no symlink and no
directory that others may change. A user's runtime directory is the user's word."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from exitwatch.engine import host
from exitwatch.engine.url import Endpoint, NotOwned

ME = os.getuid()


@pytest.fixture
def private() -> Iterator[Path]:
    """A directory whose every parent is root's and not writable by others, or this user's:
    /run as root, the home directory otherwise (the tests' TMPDIR is under /tmp, which
    anybody may write to)."""
    where = "/run" if ME == 0 else os.path.expanduser("~")
    made = Path(tempfile.mkdtemp(prefix="ew-host-", dir=where))
    try:
        yield made
    finally:
        shutil.rmtree(made)


@contextlib.contextmanager
def listening(path: Path) -> Iterator[socket.socket]:
    path.parent.mkdir(parents=True, exist_ok=True)
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    sock.listen()
    try:
        yield sock
    finally:
        sock.close()


def test_each_users_rootless_engines_are_found_and_nothing_else(private: Path) -> None:
    run_user = private / "user"
    with (
        listening(run_user / str(ME) / "docker.sock"),
        listening(run_user / str(ME) / "podman" / "podman.sock"),
        listening(private / "elsewhere.sock"),
        listening(run_user / "4242" / "docker.sock"),  # this user's, in another's place
    ):
        (run_user / "4243").mkdir()
        (run_user / "4243" / "docker.sock").symlink_to(private / "elsewhere.sock")
        (run_user / "not-a-uid").mkdir()
        found = host.find(str(run_user), str(private / "no-podman.sock"))
    assert [(f.endpoint.where, f.endpoint.owner, f.how) for f in found] == [
        (f"{run_user}/{ME}/docker.sock", ME, f"rootless Docker of uid {ME}"),
        (f"{run_user}/{ME}/podman/podman.sock", ME, f"rootless podman of uid {ME}"),
    ]


def test_a_found_engine_is_reached_while_it_is_its_users_own(private: Path) -> None:
    path = private / "u" / "docker.sock"
    with listening(path) as server:
        Endpoint.owned(str(path), ME).connect(5).close()
        server.accept()[0].close()
        with pytest.raises(NotOwned, match=f"belongs to uid {ME}, not {ME + 1}"):
            Endpoint.owned(str(path), ME + 1).connect(5)


def test_a_symlink_anywhere_on_the_way_is_not_followed(private: Path) -> None:
    with listening(private / "real" / "docker.sock"):
        (private / "link.sock").symlink_to(private / "real" / "docker.sock")
        with pytest.raises(NotOwned, match="not a socket"):
            Endpoint.owned(str(private / "link.sock"), ME).connect(5)
        (private / "linkdir").symlink_to(private / "real")
        with pytest.raises(NotOwned, match="symlink"):
            Endpoint.owned(str(private / "linkdir" / "docker.sock"), ME).connect(5)


def test_a_directory_anybody_may_change_is_not_gone_through(tmp_path: Path) -> None:
    # The tests' TMPDIR lies under /tmp: root's, and writable by all.
    with (
        listening(tmp_path / "docker.sock"),
        pytest.raises(NotOwned, match="may be changed by others"),
    ):
        Endpoint.owned(str(tmp_path / "docker.sock"), ME).connect(5)


def test_a_socket_not_there_is_an_ordinary_connection_error(private: Path) -> None:
    with pytest.raises(FileNotFoundError):
        Endpoint.owned(str(private / "gone.sock"), ME).connect(5)


@pytest.mark.parametrize(
    ("url", "where", "owner"),
    [
        ("unix:///run/user/1000/docker.sock", "/run/user/1000/docker.sock", 1000),
        ("unix:///var/run/user/1000/podman/podman.sock", "/run/user/1000/podman/podman.sock", 1000),
        ("unix:///var/run/docker.sock", "/var/run/docker.sock", None),
        ("unix:///run/user/docker.sock", "/run/user/docker.sock", None),
        ("unix:///run/user/1000", "/run/user/1000", None),
    ],
)
def test_a_given_socket_in_a_users_runtime_directory_is_that_users(url, where, owner) -> None:
    endpoint = Endpoint.parse(url)
    assert (endpoint.where, endpoint.owner, endpoint.url) == (where, owner, url)
