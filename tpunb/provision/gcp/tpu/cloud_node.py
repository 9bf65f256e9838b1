"""The cloud side of a slice whose hosts are a Cloud TPU node: its state, a preemption watch,
its price, its end.

Before each cell the Slice asks ``check()``: if the node was preempted or terminated, the cell
fails with a line that says so and what to do, instead of a confusing SSH error. A background
thread refreshes the state every ``TPUNB_WATCH_INTERVAL`` seconds (30 by default) so that a
preemption is noticed (and said once) even while nobody runs a cell.
"""
from __future__ import annotations

import time

from tpunb import catalog
from tpunb.provision.gcp.tpu import api, lookups
from tpunb.provision.gcp.config import format_duration
from tpunb.provision.gcp.shared import price_per_hour
from tpunb.provision.gcp.watch import FRESH_SECONDS, WatchedNode


class CloudNode(WatchedNode):
    """One node (or queued resource) in one project and zone, watched while the slice is attached."""

    def __init__(self, name: str, accelerator: str, project: str, zone: str, spot: bool,
                 info: api.NodeInfo | None = None, watch: bool = True, idle_delete: float = 0.0,
                 queued: bool = False, slices: int = 1) -> None:
        self.name, self.project, self.zone, self.spot = name, project, zone, spot
        self.slices = slices  # a multislice: its queued resource's nodes, watched, priced and deleted as one
        self.idle_seconds = float(idle_delete or 0)
        self.queued = queued
        self.accelerator = catalog.lookup(accelerator)
        self.info = info
        self.checked_at = time.monotonic() if info is not None else 0.0
        self._problem: tuple[float, str | None] = (float("-inf"), None)  # when read, what the watchdog said
        self._start_watch(watch)

    @property
    def price_per_hour(self) -> float | None:
        return price_per_hour(self.accelerator, self.spot, self.slices)

    def refresh(self) -> api.NodeInfo | None:
        return self.update(api.get(self.project, self.zone, self.name, queued=self.queued or self.slices > 1))

    def update(self, info: api.NodeInfo | None) -> api.NodeInfo | None:
        """Take a state the caller already has (one list call covers every node of a zone)."""
        self.info = info
        self.checked_at = time.monotonic()
        return info

    def lost_reason(self) -> str | None:
        """Why the node's hosts are gone for good (preempted, deleted...), or None if they are not."""
        info = self.info
        idle = (f" (its idle autodelete deletes it after {format_duration(self.idle_seconds)} without a cell)"
                if self.idle_seconds else "")
        if info is None:
            return f"its node {self.name} no longer exists in {self.project}/{self.zone}{idle}"
        if info.lost:
            state = info.state or info.queued_state
            why = " (spot capacity was reclaimed)" if self.spot and state == "PREEMPTED" else ""
            why = idle if state == "DELETING" else why
            which = "a node of this multislice" if self.slices > 1 else "its node"
            return f"{which} is {state}{why}"
        return None

    def advice(self) -> str:
        """What to do about the node's state (after lost_reason)."""
        state = self.info.state if self.info is not None else None
        recover, down = f"%tpu_launch --recover {self.name}", f"%tpu_down {self.name}"
        if state in ("STOPPED", "STOPPING"):
            return (f"Start it again with `gcloud compute tpus tpu-vm start {self.name} --zone {self.zone} "
                    f"--project {self.project}` and then %tpu_use {self.name}, or delete it with {down}")
        if state == "UNKNOWN":
            return (f"Google cannot tell its state (its hosts may come back): run the cell again in a few minutes, "
                    f"or relaunch it with {recover}")
        if state == "REPAIRING":
            return f"Google is repairing it: run the cell again in a few minutes, or relaunch it with {recover}"
        if state == "DELETING":
            return f"It is going away: {down} forgets it, {recover} launches it again"
        return f"Relaunch it with {recover}, or delete it with {down}"

    def host_init(self, index: int) -> dict:
        """Host 0 arms the idle watchdog when it starts: an attaching kernel is activity, and a
        node whose boot did not arm it gets it now."""
        if index != 0 or not self.idle_seconds:
            return {}
        from tpunb.transport.bundle import idle_script

        config = api.idle_config(self.project, self.zone, self.name, self.idle_seconds, self.queued)
        return {"idle": {**config, "source": idle_script()}}

    def idle_problem(self) -> str | None:
        """Why the slice's idle watchdog cannot delete the node ("": it can; None: not said or no
        idle autodelete), as it wrote on worker 0; read at most every FRESH_SECONDS."""
        if not self.idle_seconds or self.info is None or self.slices > 1:
            return None
        read_at, said = self._problem
        if time.monotonic() - read_at > FRESH_SECONDS:
            said = lookups.idle_problem(self.project, self.zone, self.name)
            self._problem = (time.monotonic(), said)
        return said

    def status(self) -> dict:
        info = self.info
        uptime = info.uptime() if info is not None else None
        problem = self.idle_problem()
        return {"cloud_state": (info.state or info.queued_state) if info else "GONE",
                "health": info.health if info else None,
                "uptime_s": round(uptime, 1) if uptime is not None else None,
                "usd_per_hour": self.price_per_hour,
                "idle_delete_failing": f"idle delete failing: {problem}" if problem else None}


    def delete(self) -> None:
        self.close()
        api.delete(self.project, self.zone, self.name, wait=True, queued=self.queued or self.slices > 1)
