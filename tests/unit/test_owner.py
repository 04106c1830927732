import os
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exitwatch import owner as owners
from exitwatch import procfs
from exitwatch.owner import (
    Owner,
    OwnerError,
    current_boot_id,
    current_machine_id,
    death,
    describe_status,
    elsewhere,
    owner_of,
    read_machine_id,
)

BOOT = "2a992b04-582f-4283-93d2-115de768301c"
MACHINE = "0123456789abcdef0123456789abcdef"
OTHER_BOOT = "00000000-0000-0000-0000-000000000000"


def test_parse_stat_comm_with_spaces_and_parens():
    fields = ["0"] * 50  # fields 3..52
    fields[3 - 3], fields[4 - 3], fields[20 - 3], fields[22 - 3] = "S", "1", "7", "12345"
    fields[9 - 3] = "4194560"
    fields[52 - 3] = "2304"
    text = "42 (a) b (c)) " + " ".join(fields) + "\n"
    stat = procfs.parse_stat(text)
    assert (stat.pid, stat.comm, stat.state, stat.ppid) == (42, "a) b (c)", "S", 1)
    assert stat.num_threads == 7
    assert stat.starttime == 12345
    assert stat.exit_code == 2304
    assert stat.flags == 4194560


def test_read_stat_of_self_matches_field_22():
    with open("/proc/self/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    assert procfs.read_stat(os.getpid()).starttime == int(fields[19])


def test_read_stat_of_missing_pid_raises_process_lookup():
    with pytest.raises(ProcessLookupError):
        procfs.read_stat(2**22 + 1)


def test_owner_round_trip():
    owner = owner_of()
    assert Owner.parse(str(owner)) == owner
    assert owner.boot_id == current_boot_id()


def test_an_owner_written_here_names_this_machine_first():
    owner = owner_of()
    with open("/etc/machine-id") as f:  # the suite's hosts have one (systemd's, or dbus's)
        machine = f.read().strip()
    assert owner.machine == machine == current_machine_id()
    assert str(owner) == f"{machine}:{owner.boot_id}:{owner.pid}:{owner.starttime}"
    assert Owner.parse(str(owner)).machine == machine


def test_the_three_part_form_names_no_machine():
    owner = Owner.parse(f"{BOOT}:12:5")
    assert (owner.machine, owner.boot_id, owner.pid, owner.starttime) == ("", BOOT, 12, 5)
    assert str(owner) == f"{BOOT}:12:5"
    four = Owner.parse(f"{MACHINE}:{BOOT}:12:5")
    assert (four.machine, four.boot_id, four.pid, four.starttime) == (MACHINE, BOOT, 12, 5)


def test_the_machine_is_not_part_of_an_owners_identity():
    """One boot id is one kernel's life on one machine: the same process, said with or
    without where it lives, is one owner (one index entry, one label match)."""
    old, new = Owner.parse(f"{BOOT}:12:5"), Owner.parse(f"{MACHINE}:{BOOT}:12:5")
    assert old == new and hash(old) == hash(new) and len({old, new}) == 1
    assert new != Owner.parse(f"{MACHINE}:{BOOT}:12:6")


@pytest.mark.parametrize(
    "text",
    [
        "",
        "1:2",
        f"{BOOT}:0:5",
        f"{BOOT}:-1:5",
        f"{BOOT}:4194305:5",
        f"{BOOT}:12:-5",
        f"{BOOT}:12:{2**64}",
        f"{BOOT.upper()}:12:5",
        "not-a-uuid:12:5",
        f"{BOOT}:12:5:6",
        f"{BOOT}: 12:5",
        f"{BOOT}:١٢:5",
        f"{BOOT}:12:5" + "0" * 200,
        f":{BOOT}:12:5",
        f"{MACHINE.upper()}:{BOOT}:12:5",
        f"{MACHINE[:-1]}:{BOOT}:12:5",
        f"{MACHINE}0:{BOOT}:12:5",
        f"{MACHINE}:{BOOT}:12:5:6",
        f"{MACHINE}:{MACHINE}:12:5",
        f"{BOOT}:{BOOT}:12:5",
    ],
)
def test_malformed_owner_strings_are_rejected(text):
    with pytest.raises(OwnerError):
        Owner.parse(text)


@given(st.text(max_size=300))
def test_parse_never_raises_anything_but_owner_error(text):
    try:
        owner = Owner.parse(text)
    except OwnerError:
        return
    assert str(owner) == text


def test_live_process_is_alive():
    assert death(owner_of()) is None


def test_other_boot_is_dead():
    me = owner_of()
    other = Owner(OTHER_BOOT, me.pid, me.starttime)
    assert "boot" in death(other)


def _other_machine() -> str:
    return "1" * 32 if current_machine_id() == "0" * 32 else "0" * 32


def test_an_earlier_boot_of_this_machine_is_dead():
    me = owner_of()
    earlier = Owner(OTHER_BOOT, me.pid, me.starttime, current_machine_id())
    assert elsewhere(earlier) is None
    assert death(earlier) == "boot id differs (host rebooted)"


def test_another_machines_owner_is_never_dead_here():
    """Its boot id is not this one, and its pid names nobody here: neither says it died."""
    me = owner_of()
    machine = _other_machine()
    for pid, start in ((me.pid, me.starttime), (me.pid, me.starttime + 1), (PID_GONE, 1)):
        away = Owner(OTHER_BOOT, pid, start, machine)
        assert elsewhere(away) == f"of machine {machine}, not this one"
        assert death(away) is None


PID_GONE = 4 * 1024 * 1024  # PID_MAX_LIMIT: no process has it


def test_an_owner_of_this_boot_is_judged_whatever_machine_it_names():
    """Written in a mount namespace with a /etc/machine-id of its own (a container's, on
    the host's pids), an owner of this boot is this machine's all the same."""
    me = owner_of()
    machine = _other_machine()
    assert elsewhere(Owner(me.boot_id, me.pid, me.starttime, machine)) is None
    assert death(Owner(me.boot_id, me.pid, me.starttime, machine)) is None
    assert "reused" in death(Owner(me.boot_id, me.pid, me.starttime + 1, machine))


def test_without_a_machine_id_here_an_owner_that_names_one_and_another_boot_is_left(
    monkeypatch,
):
    monkeypatch.setattr(owners, "current_machine", lambda: ("", "/etc/machine-id: missing"))
    me = owner_of()
    assert me.machine == "" and str(me).count(":") == 2  # written in the 3-part form
    away = Owner(OTHER_BOOT, me.pid, me.starttime, MACHINE)
    assert "this machine has no machine id (/etc/machine-id: missing)" in elsewhere(away)
    assert death(away) is None
    assert "boot" in death(Owner(OTHER_BOOT, me.pid, me.starttime))  # 3-part: as before


def test_the_machine_id_falls_back_to_dbus_s(tmp_path):
    etc, dbus = tmp_path / "machine-id", tmp_path / "dbus-machine-id"
    dbus.write_text(MACHINE + "\n")
    paths = (str(etc), str(dbus))
    assert read_machine_id(paths) == (MACHINE, str(dbus))  # no /etc/machine-id
    for text in ("", "uninitialized\n", MACHINE.upper() + "\n", MACHINE[:-1] + "\n"):
        etc.write_text(text)  # one that holds no machine id: systemd's first boot, say
        assert read_machine_id(paths) == (MACHINE, str(dbus))
    etc.write_text(MACHINE.replace("0", "f") + "\n")
    assert read_machine_id(paths) == (MACHINE.replace("0", "f"), str(etc))


def test_with_no_machine_id_anywhere_it_says_where_it_looked(tmp_path):
    etc = tmp_path / "machine-id"
    etc.write_text("uninitialized\n")
    machine, why = read_machine_id((str(etc), str(tmp_path / "none")))
    assert machine == ""
    assert why == f"{etc}: holds no machine id; {tmp_path / 'none'}: No such file or directory"


def test_reused_pid_is_dead():
    me = owner_of()
    assert "reused" in death(Owner(me.boot_id, me.pid, me.starttime + 1))


def test_gone_process_is_dead():
    child = subprocess.Popen(["sleep", "60"])
    owner = owner_of(child.pid)
    child.kill()
    child.wait()
    assert death(owner) == "process gone"


def test_zombie_is_dead_with_its_status():
    child = subprocess.Popen([sys.executable, "-c", "import os; os._exit(3)"])
    owner = owner_of(child.pid)
    # Not waited for: the child stays a zombie until we reap it below.
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
    assert death(owner) == "zombie, exited with code 3"
    child.wait()


@pytest.mark.parametrize(
    ("status", "text"),
    [
        (None, "unknown"),
        (0, "exited with code 0"),
        (0x300, "exited with code 3"),
        (9, "killed by SIGKILL"),
        (15 | 0x80, "killed by SIGTERM"),
        (0x7E, "killed by signal 126"),
    ],
)
def test_describe_status(status, text):
    assert describe_status(status) == text


def test_a_machine_id_file_that_cannot_be_read_now_is_no_answer(tmp_path):
    """EIO (as /proc/self/mem gives at offset 0), EMFILE: nothing is known of the file, so
    the reading raises rather than say "no machine id" (current_machine() keeps no error,
    and reads again next time)."""
    (tmp_path / "dbus-machine-id").write_text(MACHINE + "\n")
    with pytest.raises(OSError):
        read_machine_id(("/proc/self/mem", str(tmp_path / "dbus-machine-id")))
    machine, why = read_machine_id((str(tmp_path), str(tmp_path / "none")))  # a directory
    assert machine == "" and why.startswith(f"{tmp_path}: Is a directory")
