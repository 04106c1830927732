"""Bad config files, bad command lines and a foreign pid namespace stop `exitwatch agent`
and `exitwatch reap` with one line, never a traceback. As root: a command that must run as
root says only that to anyone else, before it looks at what it was given."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from exitwatch.engine import url

from support.cli import EXITWATCH, exitwatch


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("colour = 3\n", "unknown key 'colour'"),
        ('poll_interval = "fast"\n', "poll_interval: expected a number, got 'fast'"),
        ('source = "psychic"\n', "source: expected one of auto, ebpf, netlink, poll"),
        ("workdir_depth = 0\n", "workdirs.depth: expected an integer in 1..16, got 0"),
        ('workdir_roots = "/tmp"\n', "workdir_roots: expected a list of strings"),
        ('metrics_addr = "localhost"\n', "metrics_addr: expected HOST:PORT"),
        ('docker_host = "tcp://10.0.0.5:2375"\n', "docker_host: expected a local engine's unix://"),
        ("dry_run = [\n", "not valid TOML"),
    ],
)
def test_config_errors_are_one_line_and_stop_the_agent(tmp_path, body, expected):
    config = tmp_path / "config.toml"
    config.write_text(body)
    done = exitwatch("agent", "--config", str(config))
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"Error: {config}: ")
    assert expected in lines[0]


def test_missing_config_file_is_one_line(tmp_path):
    done = exitwatch("agent", "--config", str(tmp_path / "nope.toml"))
    assert done.returncode != 0
    assert done.stderr.strip() == (
        f"Error: {tmp_path / 'nope.toml'}: cannot read: No such file or directory (give "
        "--config an existing file, or leave it out for the defaults)"
    )


def test_a_remote_engine_from_the_environment_is_refused(tmp_path):
    env = os.environ | {"DOCKER_HOST": "tcp://10.0.0.5:2375"}
    done = exitwatch("reap", "--workdir-root", str(tmp_path), "--audit-log", "", env=env)
    assert done.returncode != 0
    assert done.stderr.strip() == (
        f"Error: containers.docker_host: expected {url.EXPECTED}, got 'tcp://10.0.0.5:2375'"
        f"{url.FROM_ENV}"
    )


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["labels"], "Error: inside a container (not in the host's pid namespace)"),
        (["mark", "/tmp"], "Error: inside a container (not in the host's pid namespace)"),
        (["agent"], "Error: exitwatch agent must run in the host's pid namespace"),
        (["reap"], "Error: exitwatch reap must run in the host's pid namespace"),
    ],
)
def test_nothing_is_named_or_judged_from_another_pid_namespace(argv, expected):
    done = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", *EXITWATCH, *argv],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert done.stderr.startswith(expected), done.stderr


_BAD_ARGS = [
    ["agent", "--source", "bogus"],
    ["agent", "--poll-interval", "-1"],
    ["agent", "--poll-interval", "nan"],
    ["agent", "--workdir-depth", "99"],
    ["agent", "--no-such-option"],
    ["reap", "--docker-host", "unix:///nonexistent/docker.sock", "--workdir-root", "/nonexistent"],
    ["reap", "--docker-host", "tcp://[::1"],
    ["labels", "--pid", "0"],
    ["labels", "--pid", "4194305"],
    ["mark", "/nonexistent/dir", "--pid", "1"],
    ["no-such-command"],
]


@pytest.mark.parametrize("args", _BAD_ARGS, ids=" ".join)
def test_bad_command_lines_exit_non_zero_with_one_error_line(args: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "exitwatch", *args], capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1, done.stderr
