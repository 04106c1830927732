"""Leases: directories in a spool, each holding a command the agent runs as the directory's
owner every so often, while the lease's owner lives (alive.while_alive writes them).

kind.py is the kind and its schedule; the spool's reading, listing and running are
kinds/spool's, as for hooks.
"""
