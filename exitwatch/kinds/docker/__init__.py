"""Containers labelled with an owner, with their compose projects, networks and volumes.

kind.py is the kind; engine.py is the narrow Docker client it uses, and unixhttp.py speaks
its calls over the engine's socket, whose path host.py reads from a URL; compose.py is the
rule of which project members are the owner's, networks.py what an ended run leaves beside
its containers.
"""
