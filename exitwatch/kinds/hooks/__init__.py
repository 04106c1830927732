"""On-death hooks: directories in a spool, each holding a command to run as the
directory's owner once its owner is dead.

kind.py is the kind; file.py reads and checks one hook; spool.py lists the spool;
spawn.py runs one command as its user.
"""
