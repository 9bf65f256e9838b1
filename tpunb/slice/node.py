"""What a slice is beyond its host processes (``Node``): nothing for hosts brought over SSH and
local host processes; a cloud node (state, price, preemption, deletion) overrides every method."""
from __future__ import annotations


class Node:
    """What a slice is beyond its host processes. Hosts brought over SSH and local host
    processes have nothing more (this base); a Cloud TPU node overrides every method."""

    #: seconds without activity after which a watchdog on host 0 deletes the node (0: never)
    idle_seconds = 0.0
    #: host 0 runs a boot watchdog that deletes the node unless a kernel says its launch is done
    boot_guard = False

    def host_init(self, index: int) -> dict:
        """What host ``index``'s agent is told at start beyond the backend's settings."""
        return {}

    def check(self, fresh: bool = False) -> None:
        """Before a cell: raise a one-line ProvisionError if the hosts are gone for good;
        ``fresh``: ask now, not from the last look (hosts died: was their machine deleted?)."""

    def explain_deaths(self) -> str | None:
        """Hosts vanished mid-cell: the outside reason (preempted, ...), or None."""
        return None

    def status(self) -> dict:
        """Extra status columns (cloud_state, health, usd_per_hour, uptime_s)."""
        return {}

    def close(self) -> None:
        """Stop watching (the kernel detaches); the node itself stays."""

    def delete(self) -> None:
        """Delete what outlives the host processes and wait until it is gone; idempotent."""
