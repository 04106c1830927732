"""`exitwatch adopt`: one labelling Docker socket for the whole host, served as a service
(service.py), with the policy of peers.py, which finds each connection's owner from its
client process; containers.py says which container holds a client and whether that
container is meant to own; listening.py is its socket, passed by systemd or bound fresh,
and its mode.

It may import exitwatch.proxy (the socket), exitwatch.engine (to ask the engine which
container a cgroup is), exitwatch.contract (the labels), exitwatch.owner and
exitwatch.procfs; never exitwatch.run, the agent or the service.
"""
