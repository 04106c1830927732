"""What the kinds whose resources are entries of a spool share (hooks, leases, watchdogs):
entry.py reads and checks one entry without following a link, listing.py lists a spool
bounded per user, kind.py follows it (inotify, else listings) and deletes a dead owner's
entries, spawn.py runs one command as its user, timed.py is the timer of the kinds that act
on live owners at set times (leases, watchdogs). Each kind brings its Format.
"""
