"""The cloud side of an attached Compute Engine slice (``Slice.node``): what %tpu_down deletes,
in order (MIG, template, policy; or the instance), and its price for %tpu_status (its state comes
from the backend's ``slice_status``, asked once per view). No preemption watch yet: a preempted
VM is a host that died, as on hosts you bring."""
from __future__ import annotations

from typing import Callable

from tpunb.registry import SliceRecord
from tpunb.slice import Node


class ComputeNode(Node):
    def __init__(self, record: SliceRecord, delete: Callable[[SliceRecord], None], price_per_hour: float | None) -> None:
        self.record = record
        self._delete = delete
        self.price_per_hour = price_per_hour

    def status(self) -> dict:
        return {"health": None, "uptime_s": None, "usd_per_hour": self.price_per_hour, "idle_delete_failing": None}

    def delete(self) -> None:
        self._delete(self.record)
