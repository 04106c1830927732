"""Workdirs: directories under the configured roots that hold an owner marker.

kind.py is the kind and its removal; tree.py walks the roots and judges each marker
(marker.py reads and parses one); watch.py follows the roots with inotify, or rescans.
"""

DEPTH = 3  # how many levels below a root a workdir may be, by default ([workdirs] depth)
