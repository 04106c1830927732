"""The netlink source's pure logic: proc connector messages parsed as the kernel lays them
out, the kernel version its exit filter needs, and the control message's layout.
system/test_sources.py has the source on the real kernel."""

import struct

import pytest

from exitwatch.sources import netlink as nl

pytestmark = pytest.mark.usefixtures("no_leaked_threads")


def nlmsg(what, pid, tgid, code=0, extra=b""):
    """One proc connector message as the kernel lays it out (struct proc_event is 40 bytes)."""
    data = struct.pack("=IIQ6I", what, 0, 0, pid, tgid, code, 17, 1, 1) + extra
    cn = struct.pack("=IIIIHH", 1, 1, 0, 0, len(data), 0) + data
    msg = struct.pack("=IHHII", 16 + len(cn), 3, 0, 0, 0) + cn
    return msg + b"\0" * (-len(msg) % 4)


def test_deliver_parses_several_messages_in_one_datagram():
    datagram = (
        nlmsg(nl.PROC_EVENT_EXIT, 100, 100, 9)
        + nlmsg(nl.PROC_EVENT_EXIT, 201, 200, 0x300, extra=b"\1\2")  # thread exit, padded
        + nlmsg(nl.PROC_EVENT_EXIT, 300, 300, 0)  # not watched
        + nlmsg(0x00000001, 400, 400)  # a fork event of a watched tgid: not an exit
        + nlmsg(nl.PROC_EVENT_EXIT, 100, 100, 9)[:40]  # truncated tail
    )
    got = []
    nl.deliver(bytearray(datagram), len(datagram), {100, 200, 400}, got.append)
    assert [(h.pid, h.status) for h in got] == [(100, 9), (200, 0x300)]
    assert all(h.at > 0 for h in got)


def test_deliver_reads_only_the_received_bytes():
    buf = bytearray(nlmsg(nl.PROC_EVENT_EXIT, 100, 100) * 2)
    got = []
    nl.deliver(buf, len(buf) // 2, {100}, got.append)
    assert len(got) == 1


def test_deliver_stops_at_a_malformed_length():
    datagram = bytearray(nlmsg(nl.PROC_EVENT_EXIT, 100, 100))
    datagram[0:4] = struct.pack("=I", 0)
    got = []
    nl.deliver(datagram, len(datagram), {100}, got.append)
    assert len(got) == 1


@pytest.mark.parametrize(
    ("release", "supported"),
    [
        ("6.6.0", True),
        ("6.18.44-fc-v857", True),
        ("6.10.3", True),
        ("7.0", True),
        ("6.5.13-generic", False),
        ("5.15.0-91-generic", False),
        ("4.19", False),
        ("x", False),
    ],
)
def test_exit_filter_needs_linux_6_6(release, supported):
    assert nl.exit_filter_supported(release) is supported


def test_control_message_layout():
    filtered = nl.control_message(nl.PROC_CN_MCAST_LISTEN, exit_only=True)
    assert struct.unpack_from("=IH", filtered) == (len(filtered), 3)
    assert struct.unpack_from("=IIIIHH", filtered, 16) == (1, 1, 0, 0, 8, 0)
    assert struct.unpack_from("=II", filtered, 36) == (1, 0x80000000)
    plain = nl.control_message(nl.PROC_CN_MCAST_IGNORE, exit_only=False)
    assert len(plain) == 40
    assert struct.unpack_from("=HH", plain, 32) == (4, 0)
    assert struct.unpack_from("=I", plain, 36) == (2,)
