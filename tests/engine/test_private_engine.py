"""The suite's own private engine (support/engine.py): what one test leaves there is gone
before the next, on every engine the suite runs on (Docker 20.10 and >= 23, whose volume
prune keeps named volumes unless told "all")."""

from __future__ import annotations

from support.engine import BUILTIN_NETWORKS, PrivateEngine


def test_clean_leaves_no_container_network_or_volume(engine: PrivateEngine) -> None:
    api = engine.client.api
    api.create_volume("ew-named")
    api.create_network("ew-net")
    cid = api.create_container(
        engine.image, host_config=api.create_host_config(binds=["ew-used:/data"])
    )["Id"]
    api.start(cid)
    api.create_container(engine.image, volumes=["/scratch"])  # an anonymous volume

    engine.clean()

    assert api.containers(all=True) == []
    assert {n["Name"] for n in api.networks()} <= BUILTIN_NETWORKS
    assert [v["Name"] for v in api.volumes()["Volumes"] or []] == []
