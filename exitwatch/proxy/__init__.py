"""The labelling Docker socket that `exitwatch run` and `exitwatch adopt` both serve: every
connection forwarded to the engine, with its owner's label added to what it creates.

server.py accepts and asks the policy (policy.py) whose each connection is; reader.py
reads the requests with h11 (framing.py their framing, routes.py which handler the engine
runs, creation.py the label on a creation's body, volumes.py the named volumes made first,
through exitwatch.engine); responses.py passes the engine's answers back; relay.py moves the
bytes; limits.py bounds the connections served at once, in all and per client, below
the process's task and descriptor limits. safedir.py is the rule for a directory a socket
may be served in.

It may import exitwatch.contract, exitwatch.engine (the engine's URL and requests) and
exitwatch.kinds.fsops (the raw file-system calls); never exitwatch.run, exitwatch.adopt,
the agent or the service.
"""
