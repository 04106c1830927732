"""exitwatch: reap the containers and workdirs of processes that died without cleaning up."""

from exitwatch.alive import cancel_lease, watchdog, while_alive
from exitwatch.contract import cancel_hook, mark_workdir, on_death, owner_labels

__version__ = "0.1.0"
__all__ = [
    "__version__",
    "cancel_hook",
    "cancel_lease",
    "mark_workdir",
    "on_death",
    "owner_labels",
    "watchdog",
    "while_alive",
]
