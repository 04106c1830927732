"""What an owner can own: one interface (base.py) and one package per kind of resource.

Each kind lists its resources, follows their changes on a discovery thread
(discovery.py), and removes a dead owner's. fsops.py and inotify.py are the raw,
root-safe file-system calls that the workdir and spool kinds share; spool/ is what the
kinds whose resources are entries of a spool share (hooks, leases, watchdogs). Kinds may
import exitwatch.owner, exitwatch.procfs, exitwatch.contract and exitwatch.alive, never
the agent or the service.
"""
