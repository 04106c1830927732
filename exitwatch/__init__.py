"""exitwatch: reap the containers and workdirs of processes that died without cleaning up."""

from exitwatch.contract import mark_workdir, owner_labels

__version__ = "0.1.0"
__all__ = ["__version__", "mark_workdir", "owner_labels"]
