"""Containers, networks and volumes labelled with an owner, with their compose projects
(and podman's pods).

kind.py is the kind; it reaches the engine only through exitwatch.engine (the seam:
the URL, the connection, the client), and attempts.py is how its removals take the
engine's answers; labels.py reads an owner off a container, network or volume and keys
each; compose.py is the rule of which project members are the owner's, projects.py
applies it to a project as the engine lists it, networks.py removes what an ended run
leaves beside its containers, pods.py podman's pods before them.
"""
