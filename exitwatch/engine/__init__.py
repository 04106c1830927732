"""The engine seam: the one place that knows what an engine URL means, how to reach the
engine it names, and how to speak its HTTP API. Several engines at once are several
clients: nothing here is a module-level singleton.

url.py reads an engine URL (which schemes, the default, DOCKER_HOST) into an Endpoint,
which connects (a found one only while its socket is plainly its user's); host.py finds
the engines a host runs where their programs put them (root's podman, users' rootless
Docker and podman); errors.py is what an engine's refusal is; http.py speaks HTTP/1.1 over a
connection with http.client (requests and streams), client.py the calls the docker kind
makes through it; oneshot.py a single bounded request with h11, for the labelling proxy,
whose start must not pay for http.client; api.py the narrow interfaces those clients
implement, which tests fake (tests/support/fakeengine.py).

It imports nothing of exitwatch but itself: never kinds/, proxy/, run/, adopt/, agent/ or
service/, which all reach the engine through it. This file imports nothing, so that a
light user (`exitwatch run`'s start) pays only for the modules it names.
"""
