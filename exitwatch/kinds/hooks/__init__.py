"""On-death hooks: files in a spool, each a command to run as its file's owner once its
owner is dead.

kind.py is the kind; file.py reads and checks one hook file; spool.py lists the spool;
spawn.py runs one command as its user.
"""
