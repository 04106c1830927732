"""Watchdogs: directories in a spool, each naming an owner and a timeout; the agent ends an
owner whose watchdog went unpetted for that long (alive.watchdog arms one).

kind.py is the kind and its timer, armed.py what the timer knows of each watchdog and how
it reads a pet; the spool's reading and listing are kinds/spool's.
"""
