"""On-death hooks: directories in a spool, each holding a command to run as the
directory's owner once its owner is dead.

kind.py is the kind; kinds/spool reads and checks one entry (entry.py), lists and follows
the spool (listing.py, kind.py) and runs one command as its user (spawn.py).
"""
