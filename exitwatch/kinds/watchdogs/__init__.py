"""Watchdogs: directories in a spool, each naming an owner and a timeout; the agent ends an
owner whose watchdog went unpetted for that long (alive.watchdog arms one).

kind.py is the kind and its timer; the spool's reading and listing are kinds/spool's.
"""
