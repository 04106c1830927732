"""Which containers `exitwatch adopt` makes owners (adopt/containers.py): only those meant
to be, by their label or an operator's pattern over their name or image."""

from __future__ import annotations

from exitwatch.adopt.containers import is_owner
from exitwatch.procfs import parse_stat


def _doc(name: str = "/app", image: str = "busybox:1", labels: object = None) -> dict:
    return {"Name": name, "Config": {"Image": image, "Labels": labels}, "State": {"Pid": 0}}


def test_a_container_is_no_owner_unless_said() -> None:
    assert not is_owner(_doc(), ())
    assert not is_owner(_doc(labels={"exitwatch.adopt": "no"}), ())
    assert not is_owner(_doc(labels={"exitwatch.owner": "x"}), ("runner-*",))


def test_its_label_makes_it_an_owner() -> None:
    assert is_owner(_doc(labels={"exitwatch.adopt": "owner"}), ())
    assert is_owner(_doc(labels={"exitwatch.adopt": " Owner "}), ())


def test_a_pattern_over_its_name_or_image_makes_it_an_owner() -> None:
    assert is_owner(_doc(name="/runner-7"), ("runner-*",))
    assert is_owner(_doc(image="my-runner:2.1"), ("my-runner:*",))
    assert not is_owner(_doc(name="/portainer", image="portainer/portainer-ce"), ("runner-*",))


def test_a_malformed_document_is_no_owner() -> None:
    assert not is_owner({"Name": "/x", "Config": "nonsense"}, ("runner-*",))
    assert not is_owner({"Config": {"Labels": ["exitwatch.adopt=owner"]}}, ())


def test_stat_gives_the_process_group() -> None:
    line = "42 (a) b) S 1 40 40 0 -1 4194560" + " 0" * 42
    st = parse_stat(line)
    assert (st.ppid, st.pgrp) == (1, 40)
