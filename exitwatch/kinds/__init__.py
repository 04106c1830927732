"""What an owner can own: one interface (base.py) and one package per kind of resource.

Each kind lists its resources, follows their changes on a discovery thread
(discovery.py), and removes a dead owner's. fsops.py and inotify.py are the raw,
root-safe file-system calls that the workdir and hook kinds share. Kinds may import
exitwatch.owner, exitwatch.procfs and exitwatch.contract, never the agent or the service.
"""
