import os
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exitwatch import procfs
from exitwatch.owner import Owner, OwnerError, current_boot_id, death, describe_status, owner_of

BOOT = "2a992b04-582f-4283-93d2-115de768301c"


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
    other = Owner("00000000-0000-0000-0000-000000000000", me.pid, me.starttime)
    assert "boot" in death(other)


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
