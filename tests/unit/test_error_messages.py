"""Every error a person can meet names what is wrong and what to do about it: each case
below provokes one, through the command line as a person would meet it (or the call that
says it, where the command line needs root or a kernel), and checks its one line for both
halves. system/test_cli_errors.py checks the same lines from a real process, as root."""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from exitwatch import contract, procfs
from exitwatch.adopt import service as adopt_service
from exitwatch.adopt.service import AdoptError
from exitwatch.cli import cli
from exitwatch.contract import ENV_HOOK_DIR, HOOK_MAX_BYTES
from exitwatch.engine import url
from exitwatch.owner import PID_MAX
from exitwatch.run import cli as runner_cli
from exitwatch.service.metrics import Metrics, MetricsError
from exitwatch.service.status import server
from exitwatch.sources import SourceError, ebpf, netlink

NO_PID = PID_MAX  # no process has the largest pid the kernel allows, but by a rare chance


def _error(args: list[str], env: dict[str, str] | None = None) -> str:
    """The one error line `exitwatch ARGS` prints, without its "Error: "."""
    done = CliRunner().invoke(cli, args, env=env)
    assert done.exit_code == 1, (done.exit_code, done.output)
    lines = [line for line in done.output.splitlines() if line.startswith("Error: ")]
    assert len(lines) == 1, done.output
    return lines[0].removeprefix("Error: ")


@pytest.fixture
def as_root(monkeypatch: pytest.MonkeyPatch) -> None:
    """The commands' root check passed, in the host's namespaces."""
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(procfs, "foreign_namespace", lambda *names: None)


@pytest.fixture
def in_a_container(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(procfs, "foreign_namespace", lambda *names: "pid")


def test_on_death_without_an_agent_says_to_install_one(tmp_path: Path) -> None:
    spool = tmp_path / "hooks"
    said = _error(["on-death", "--", "true"], env={ENV_HOOK_DIR: str(spool)})
    assert f"no exitwatch agent on this host? (its hook spool {spool} is missing)" in said
    assert "install and start exitwatch" in said and ENV_HOOK_DIR in said
    said = _error(["on-death", "--cancel", "0" * 32], env={ENV_HOOK_DIR: str(spool)})
    assert "install and start exitwatch" in said


def test_a_spool_others_could_tamper_with_says_what_it_must_be(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "real")
    said = _error(["on-death", "--", "true"], env={ENV_HOOK_DIR: str(link)})
    assert f"hook spool {link}: it is a symlink" in said
    assert "it must be a directory of root's, mode 1733, as the agent makes it" in said


def test_a_spool_that_refuses_a_hook_says_who_can_fix_it() -> None:
    said = runner_cli._why(PermissionError(13, "Permission denied", "/var/spool/x"))
    assert "hook spool /var/spool/x: Permission denied" in said
    assert "ask root to fix its mode" in said


def test_hook_ids_and_sizes_say_what_to_give(monkeypatch: pytest.MonkeyPatch) -> None:
    said = _error(["on-death", "--cancel", "nope"])
    assert "'nope' is not a hook id (32 hex digits)" in said
    assert "give the id that on_death (exitwatch on-death) printed" in said
    said = _error(["on-death", "--", "x" * (HOOK_MAX_BYTES + 1)])
    assert f"at most {HOOK_MAX_BYTES}" in said and "shorten its command or its env" in said
    monkeypatch.setattr(runner_cli, "cancel_hook", lambda hook_id: False)
    said = _error(["on-death", "--cancel", "0" * 32])
    assert f"no hook {'0' * 32}: it ran, or was cancelled; nothing is left to cancel" == said


def test_another_users_hook_says_who_may_cancel_it(monkeypatch, tmp_path: Path) -> None:
    """cancel_hook's own check, on a spool of the test's (the real one is root's)."""
    hook_id = "0" * 32
    (tmp_path / hook_id).mkdir()
    mine = os.geteuid()
    flags = os.O_RDONLY | os.O_DIRECTORY
    monkeypatch.setattr(contract, "open_spool", lambda path: os.open(tmp_path, flags))
    monkeypatch.setattr(os, "geteuid", lambda: mine + 1)
    said = _error(["on-death", "--cancel", hook_id])
    assert said == f"hook {hook_id} belongs to uid {mine}, not to you: cancel it as that user"
    assert (tmp_path / hook_id).is_dir()


def _raises(kind: type[Exception], message: str) -> Callable[..., object]:
    def call(*args: object, **kwargs: object) -> object:
        raise kind(message)

    return call


@pytest.mark.parametrize("command", [["labels"], ["mark", "/tmp"], ["on-death", "--", "true"]])
def test_no_such_process_says_to_give_a_running_one(command: list[str]) -> None:
    said = _error([command[0], "--pid", str(NO_PID), *command[1:]])
    assert said == (
        f"no process with pid {NO_PID}: give --pid a running process (default: this shell)"
    )


def test_owners_named_inside_a_container_point_at_adopt(in_a_container, tmp_path) -> None:
    for args in (["labels"], ["mark", str(tmp_path)]):
        said = _error(args)
        assert said.startswith("inside a container (not in the host's pid namespace)")
        assert "use `exitwatch adopt` (exitwatch-adopt(8))" in said
        assert "else name owners from the host" in said


def test_marking_what_is_not_a_directory_says_what_to_give(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    assert _error(["mark", str(missing)]) == (
        f"cannot mark {missing}: No such file or directory (make the directory first)"
    )
    link = tmp_path / "link"
    link.symlink_to(tmp_path)
    said = _error(["mark", str(link)])
    assert said.startswith(f"cannot mark {link}: ")
    assert "only a directory is marked, never through a symlink: give its own path" in said


@pytest.mark.parametrize("command", ["agent", "reap"])
def test_the_agents_commands_say_where_to_run(monkeypatch, in_a_container, command) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    said = _error([command])
    assert said.startswith(f"exitwatch {command} must run as root: ")
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    said = _error([command])
    assert said.startswith(f"exitwatch {command} must run in the host's pid namespace")
    assert "(inside a container? run it on the host)" in said


def test_config_files_say_what_to_give(as_root, tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    assert _error(["agent", "--config", str(missing)]) == (
        f"{missing}: cannot read: No such file or directory (give --config an existing file, "
        "or leave it out for the defaults)"
    )
    bad = tmp_path / "bad.toml"
    bad.write_text('poll_interval = "fast"\n')
    said = _error(["agent", "--config", str(bad)])
    assert said == f"{bad}: poll_interval: expected a number, got 'fast'"
    bad.write_text("colour = 3\n")
    said = _error(["agent", "--config", str(bad)])
    assert said.startswith(f"{bad}: unknown key 'colour' (known: ") and "poll_interval" in said


def test_reap_without_an_engine_says_to_start_or_name_one(as_root, tmp_path: Path) -> None:
    host = f"unix://{tmp_path}/docker.sock"
    args = ["--docker-host", host, "--workdir-root", str(tmp_path), "--audit-log", ""]
    said = _error(["reap", *args, "--hook-dir", str(tmp_path / "hooks")])
    assert said.startswith(f"no Docker engine answers at {host}: ")
    assert said.endswith(
        ": start it, point [containers] at another (exitwatch.toml(5)), or turn the kind off "
        "there (enabled = false)"
    )


def test_a_remote_engine_from_the_environment_says_where_it_came_from(as_root, tmp_path):
    said = _error(
        ["reap", "--config", _empty(tmp_path), "--workdir-root", str(tmp_path)],
        env={"DOCKER_HOST": "tcp://10.0.0.5:2375"},
    )
    assert said == (
        f"containers.docker_host: expected {url.EXPECTED}, got 'tcp://10.0.0.5:2375'"
        " (from DOCKER_HOST: unset it, or point it at the engine's unix:// socket)"
    )


def test_adopt_with_a_remote_engine_says_to_point_at_a_socket(as_root, tmp_path) -> None:
    said = _error(
        ["adopt", "--config", _empty(tmp_path), "--listen", str(tmp_path / "a.sock")],
        env={"DOCKER_HOST": "tcp://10.0.0.5:2375"},
    )
    assert said.startswith("DOCKER_HOST: expected a local engine's unix:// socket")
    assert said.endswith("(from DOCKER_HOST: unset it, or point it at the engine's unix:// socket)")


def _empty(tmp_path: Path) -> str:
    path = tmp_path / "empty.toml"
    path.write_text("")
    return str(path)


def test_an_unreadable_audit_log_says_to_run_as_root(monkeypatch, tmp_path) -> None:
    audit = tmp_path / "audit.jsonl"
    monkeypatch.setattr(server, "query", lambda path: {"agent": None})
    from exitwatch.agent import audit as audit_module

    denied = PermissionError(13, "Permission denied", str(audit))
    monkeypatch.setattr(audit_module, "read", lambda path, since: (_ for _ in ()).throw(denied))
    said = _error(["status", "--config", _empty(tmp_path), "--since", "1h"])
    assert said.startswith("cannot read the audit log ")
    assert said.endswith(": Permission denied (it is root's: run exitwatch status as root)")


def test_a_second_agent_says_how_to_run_beside_the_first(tmp_path: Path) -> None:
    path = tmp_path / "status.sock"
    first = server._bind(str(path))
    try:
        with pytest.raises(server.StatusError) as err:
            _answering(first, lambda: server._bind(str(path)))
    finally:
        first.close()
    assert str(err.value) == (
        f"another agent already answers on {path}: stop it (systemctl stop exitwatch), or "
        "give this one --status-socket of its own"
    )
    path.unlink()
    path.write_text("")
    with pytest.raises(server.StatusError) as err:
        server._bind(str(path))
    assert "exists and is not a socket: move it away, or give --status-socket" in str(err.value)


def _answering(sock: socket.socket, call: Callable[[], object]) -> object:
    """`call`, while `sock` answers one client with an empty JSON object, as an agent does."""
    import threading

    def answer() -> None:
        sock.setblocking(True)
        conn, _ = sock.accept()
        with conn:
            conn.sendall(b"{}")

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    try:
        return call()
    finally:
        thread.join(5)


def test_the_ebpf_source_without_its_object_says_to_install_it(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(procfs, "foreign_namespace", lambda *names: None)
    btf = tmp_path / "vmlinux"
    btf.write_text("")
    monkeypatch.setattr(ebpf, "BTF_PATH", str(btf))
    monkeypatch.setattr(ebpf, "Libbpf", object)
    source = ebpf.EbpfSource(obj_path=str(tmp_path / "exitwatch.bpf.o"))
    with pytest.raises(SourceError) as err:
        source.load()
    assert str(err.value) == (
        f"eBPF object {tmp_path}/exitwatch.bpf.o is missing: install the exitwatch-bpf "
        "package (from a checkout: make bpf)"
    )


@pytest.mark.parametrize(
    ("errno_", "step"),
    [
        (errno.EPROTONOSUPPORT, "use a kernel with CONFIG_PROC_EVENTS, or --source poll"),
        (errno.EPERM, "run as root in the host's network namespace, or --source poll"),
    ],
)
def test_the_netlink_source_says_what_to_do(errno_: int, step: str) -> None:
    said = netlink._explain(OSError(errno_, os.strerror(errno_)), "socket")
    assert said.endswith(f"(socket: {os.strerror(errno_)}): {step}")


def test_metrics_on_a_taken_port_say_to_give_another(monkeypatch) -> None:
    pytest.importorskip("prometheus_client")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        addr = f"127.0.0.1:{taken.getsockname()[1]}"
        with pytest.raises(MetricsError) as err:
            Metrics(addr, dict)
    said = str(err.value)
    assert said.startswith(f"cannot serve metrics on {addr}: Address already in use")
    assert said.endswith(": give --metrics-addr (or metrics_addr) a free HOST:PORT")


def test_adopts_socket_says_what_to_do_where_it_cannot_listen(tmp_path: Path) -> None:
    from exitwatch.adopt import listening

    taken = tmp_path / "file.sock"
    taken.write_text("")
    with pytest.raises(listening.ListenError) as err:
        listening.bind_fresh(str(taken))
    assert str(err.value) == (
        f"{taken}: exists and is not a socket; left alone: move it away, or listen elsewhere "
        "(--listen)"
    )
    served = listening.bind_fresh(str(tmp_path / "adopt.sock"))
    try:
        with pytest.raises(listening.ListenError) as err:
            listening.bind_fresh(served.path)
        assert str(err.value).endswith("; left alone: stop it, or listen elsewhere (--listen)")
        with pytest.raises(AdoptError) as loop:
            adopt_service._not_itself(served, url.Endpoint.parse(f"unix://{served.path}"))
        assert str(loop.value) == (
            f"the engine socket {served.path} is the socket served: it would loop; name the "
            "engine's own socket ([adopt] docker_host, or --docker-host)"
        )
    finally:
        served.close()
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(listening.ListenError) as err:
        listening.bind_fresh(str(shared / "adopt.sock"))
    assert str(err.value).startswith(f"not serving {shared}/adopt.sock: ")
    assert str(err.value).endswith(": listen in a directory only root can write to")
