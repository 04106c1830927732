"""Containers labelled with an owner, with their compose projects, networks and volumes.

kind.py is the kind; engine.py is the narrow Docker client it uses, unixhttp.py the one
call made straight over the socket, compose.py the rule of which project members are
the owner's, networks.py what an ended run leaves beside its containers.
"""
