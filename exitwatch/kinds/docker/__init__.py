"""Containers labelled with an owner, with their compose projects, networks and volumes.

kind.py is the kind; it reaches the engine only through exitwatch.engine (the seam:
the URL, the connection, the client), and attempts.py is how its removals take the
engine's answers; compose.py is the rule of which project members are the owner's,
networks.py what an ended run leaves beside its containers.
"""
