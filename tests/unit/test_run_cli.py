"""`exitwatch run` refusing bad use before it runs anything: one line and its own exit
status, nothing run, nothing left behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from exitwatch.engine import url

from support.wrapper import env_for, run


@pytest.mark.parametrize(
    "args", [[], ["--"], ["--bogus", "--", "touch", "ran"], ["--grace", "x", "--", "touch", "ran"]]
)
def test_bad_use_is_one_line_and_exit_2(bases, tmp_path, args) -> None:
    done = run(args, env_for(bases), cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("exitwatch run: "), done.stderr
    assert not (tmp_path / "ran").exists()
    assert list(bases.iterdir()) == []


def test_an_engine_that_is_not_a_unix_socket_is_refused(bases, tmp_path) -> None:
    env = env_for(bases, DOCKER_HOST="tcp://127.0.0.1:2375")
    done = run(["--", "touch", "ran"], env, cwd=tmp_path)
    assert done.returncode == 125
    said = "DOCKER_HOST: expected a local engine's unix:// socket"
    assert done.stderr.count("\n") == 1 and said in done.stderr
    said = f"got 'tcp://127.0.0.1:2375'{url.FROM_ENV}"
    assert done.stderr.rstrip().endswith(said), done.stderr
    assert not (tmp_path / "ran").exists()
    assert list(bases.iterdir()) == []


@pytest.mark.parametrize("given", ["ssh://core@host:22/run/podman/podman.sock", "tcp://[::1]:8080"])
def test_a_podman_service_of_another_host_is_refused(bases, tmp_path, given: str) -> None:
    done = run(["--", "touch", "ran"], env_for(bases, CONTAINER_HOST=given), cwd=tmp_path)
    assert done.returncode == 125
    said = "CONTAINER_HOST: expected a local engine's unix:// socket"
    assert done.stderr.count("\n") == 1 and said in done.stderr
    assert done.stderr.rstrip().endswith(f"got {given!r}{url.FROM_PODMAN_ENV}"), done.stderr
    assert not (tmp_path / "ran").exists()
    assert list(bases.iterdir()) == []


def test_cmd_s_container_host_is_the_run_s_only_when_the_caller_has_one(bases, tmp_path) -> None:
    show = ["--", "sh", "-c", 'echo "${CONTAINER_HOST-unset} $DOCKER_HOST"']
    done = run(show, env_for(bases), cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.split()[0] == "unset", done.stderr
    # Another engine than DOCKER_HOST's: a second socket; the same one: the same socket.
    for given, sock in ((f"unix:{tmp_path}/podman.sock", "podman.sock"), (None, "docker.sock")):
        env = env_for(bases)
        env["CONTAINER_HOST"] = given or env["DOCKER_HOST"].replace("unix://", "unix:")
        done = run(show, env, cwd=tmp_path)
        podman, docker = done.stdout.split()
        assert done.returncode == 0, done.stderr
        assert podman == docker.replace("docker.sock", sock) and podman.startswith(
            f"unix://{bases}/"
        )
    assert list(bases.iterdir()) == []


def test_a_missing_tmpdir_is_passed_over_for_tmp_with_one_line(bases, tmp_path) -> None:
    # Whoever can remove root's TMPDIR must not be able to stop root's runs (review F9).
    where = tmp_path / "none"
    done = run(
        ["--", "sh", "-c", 'touch ran; echo "$TMPDIR"'],
        env_for(bases, TMPDIR=str(where)),
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == (
        f"exitwatch run: not using {where} (TMPDIR): No such file or directory; using /tmp\n"
    )
    assert done.stdout.startswith("/tmp/exitwatch-run-"), done.stdout
    assert not Path(done.stdout.strip()).exists()
    assert (tmp_path / "ran").exists() and not where.exists()
    assert list(bases.iterdir()) == []
