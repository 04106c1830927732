"""The agent's settings: one frozen dataclass whose fields carry their defaults."""

from __future__ import annotations

from dataclasses import asdict, dataclass

SOURCES = ("auto", "ebpf", "netlink", "poll")


@dataclass(frozen=True)
class Config:
    source: str = "auto"
    """Exit source: auto (ebpf, then netlink, then poll), ebpf, netlink or poll."""
    dry_run: bool = False
    """Log what would be removed, remove nothing."""
    poll_interval: float = 1.0
    """Seconds between procfs checks of the watched owners (poll source)."""
    workdir_roots: tuple[str, ...] = ("/tmp", "/var/tmp")
    """Directories under which marked workdirs are looked for."""
    workdir_depth: int = 3
    """How many levels below a root a workdir may be."""
    docker_host: str | None = None
    """Docker engine URL; None means DOCKER_HOST or the default socket."""
    reap_workers: int = 16
    """Removals run in parallel on this many threads."""
    reap_attempts: int = 3
    """A removal that fails is tried this many times in all, with growing delays."""

    def describe(self) -> str:
        return " ".join(f"{k}={v!r}" for k, v in asdict(self).items())
