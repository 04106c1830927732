"""`exitwatch adopt`: one labelling Docker socket for the whole host, served as a service
(service.py), with the policy of peers.py, which finds each connection's owner from its
client process; listening.py is its socket, passed by systemd or bound fresh, and its mode.

It may import exitwatch.proxy (the socket), exitwatch.owner and exitwatch.procfs; never
exitwatch.run, the agent or the service.
"""
