"""The cloud side of an attached Compute Engine slice (``Slice.node``): its VMs as Compute Engine
has them, watched while the kernel is attached, its idle watchdog, its price, its end.

A slice whose hosts are gone for good says why before the next cell, and the watch says it once
even while no cell runs, as a Cloud TPU node does: its MIG (or instance) no longer exists (its idle
watchdog deleted it, or someone else did), a VM is TERMINATED (Spot capacity reclaimed after its
30 s notice), or the MIG recreated a VM under the slice (a new VM, another id, a fresh disk: that
host's state, its agent and JAX's process, are gone). %tpu_launch --recover relaunches it.
%tpu_down deletes in order: MIG, template, policy (or the instance).

A Spot or flex-start MIG slice that loses a VM is deleted whole as soon as the loss is seen (MIG,
template, policy; its launch's only): Google does not give a Spot MIG its VM back ("To restart a
Spot VMs instance or MIG, you must delete and then recreate it"), and the survivors would bill.

Compute Engine VMs run a boot watchdog even without idle autodelete (grace-only): the kernel
tells host 0 when its launch or attach is done (``boot_guard``), which ends it."""
from __future__ import annotations

import time
from typing import Callable, NamedTuple

from tpunb import report
from tpunb.provision.gcp import failures as gcp_errors
from tpunb.provision.gcp import shared
from tpunb.provision.gcp.config import format_duration
from tpunb.provision.gcp.watch import FRESH_SECONDS, WatchedNode
from tpunb.registry import SliceRecord

#: a VM in one of these is gone for the slice (a preempted Spot VM is TERMINATED, or deleted)
LOST_STATES = ("STOPPING", "STOPPED", "TERMINATED", "SUSPENDING", "SUSPENDED")


class Vm(NamedTuple):
    """One VM of the slice as Compute Engine reports it: name, status, id and current action."""

    name: str
    status: str  # RUNNING, ... TERMINATED (LOST_STATES: gone for the slice)
    id: str  # a new VM under the same name has a new one
    action: str = "NONE"  # a MIG's currentAction (RECREATING...)


class ComputeNode(WatchedNode):
    WATCHED = "its VMs"
    #: host 0's boot watchdog waits for the kernel to say its launch is done (tpunb/host/standalone/idle.py)
    boot_guard = True

    def __init__(self, record: SliceRecord, delete: Callable[[SliceRecord], None], price_per_hour: float | None,
                 watch: bool = True) -> None:
        self.record = record
        spec = record.spec
        self.name, self.project, self.zone = record.name, spec["project"], spec["zone"]
        self.multi_host = int(spec.get("vms") or 1) > 1
        self.spot = bool(spec.get("spot"))
        self.flex = bool(spec.get("flex"))
        self.idle_seconds = float(spec.get("idle_delete") or 0)
        self._ended: str | None = None  # a Spot or flex MIG slice that lost a VM: what deleting it whole said
        self._delete = delete
        self.price_per_hour = price_per_hour
        self.vms: list[Vm] | None = None  # None: the MIG (or instance) does not exist
        self._problem: tuple[float, str | None] = (float("-inf"), None)
        self._start_watch(watch)

    # -- its state -------------------------------------------------------------------------

    def refresh(self) -> list[Vm] | None:
        """The slice's VMs now (the MIG's managed instances, or the instance); None when gone."""
        from google.api_core import exceptions

        from tpunb.provision.gcp.compute import clients

        c, where = clients.clients(), {"project": self.project, "zone": self.zone}
        try:
            if self.multi_host:
                listed = clients.call("list the MIG's VMs", c.migs.list_managed_instances, **where,
                                      instance_group_manager=self.name)
                vms = [Vm(v.instance.rsplit("/", 1)[-1] or v.name, v.instance_status, str(v.id), v.current_action)
                       for v in listed]
            else:
                vm = clients.call("read the VM", c.instances.get, **where, instance=self.name)
                vms = [Vm(vm.name, vm.status, str(vm.id))]
        except exceptions.NotFound:
            vms = None
        self.vms, self.checked_at = vms, time.monotonic()
        return vms

    def lost_reason(self) -> str | None:
        """Why the slice's hosts are gone for good, or None if they are not; a Spot or flex-start
        MIG slice that lost a VM is deleted whole on the way (once), and the reason says so."""
        if self._ended is not None:
            return self._ended  # what was said when it was deleted, not "its MIG no longer exists"
        reason = self._lost()
        if reason and self.vms is not None and self.multi_host and (self.spot or self.flex):
            kind = "Spot" if self.spot else "flex-start"
            try:
                self._delete(self.record)
                self._ended = (f"{reason}; a {kind} slice that lost a VM cannot be whole again, so its MIG, template "
                               "and policy were deleted (the other VMs no longer bill)")
            except Exception as exc:  # the loss matters more: say what is left
                self._ended = f"{reason}; deleting the rest of it failed ({gcp_errors.one_line(str(exc), 200)})"
            return self._ended
        return reason

    def _lost(self) -> str | None:
        idle = (f" (its idle autodelete deletes it after {format_duration(self.idle_seconds)} without a cell)"
                if self.idle_seconds else "")
        what = f"MIG {self.name}" if self.multi_host else f"VM {self.name}"
        if self.vms is None:
            return f"its {what} no longer exists in {self.project}/{self.zone}{idle}"
        now = {v.name: v for v in self.vms}
        for index, host in enumerate(self.record.hosts):
            name, made = host.info.extra.get("instance"), host.info.extra.get("id")
            vm = now.get(name)
            if vm is None:
                return f"its VM {name} (host {index}) no longer exists"
            if vm.status in LOST_STATES:
                why = " (spot capacity was reclaimed)" if self.spot and vm.status in ("STOPPING", "TERMINATED") else ""
                return f"its VM {name} (host {index}) is {vm.status}{why}"
            if (made and vm.id and vm.id != made) or vm.action == "RECREATING":
                return (f"its MIG recreated VM {name} (host {index}): a new VM with a fresh disk, so that host's "
                        "processes and JAX's are gone")
        return None

    # -- its idle watchdog -----------------------------------------------------------------

    def host_init(self, index: int) -> dict:
        """Host 0 arms the idle watchdog when it starts (an attaching kernel is activity)."""
        if index != 0 or not self.idle_seconds:
            return {}
        from tpunb.transport.bundle import idle_script
        from tpunb.provision.gcp.compute.bodies import idle_config

        config = idle_config(self.project, self.zone, self.name, self.idle_seconds, self.multi_host,
                             self.record.spec.get("launch") or "")
        return {"idle": {**config, "source": idle_script()}}

    def idle_problem(self) -> str | None:
        """Why the watchdog cannot delete the slice ("": it can; None: not said), as worker 0 wrote it
        in its guest attribute; read at most every FRESH_SECONDS. Before the watch's first look the
        slice is not known gone: the watchdog is asked (a status right after the launch says it)."""
        if not self.idle_seconds or (self.checked_at and self.vms is None) or not self.record.hosts:
            return None
        read_at, said = self._problem
        if time.monotonic() - read_at > FRESH_SECONDS:
            said = self.read_idle_problem()
            self._problem = (time.monotonic(), said)
        return said

    def read_idle_problem(self) -> str | None:
        from tpunb.host.standalone.idle import ERROR_ATTRIBUTE
        from tpunb.provision.gcp.compute import clients

        worker0 = self.record.hosts[0].info.extra.get("instance") or self.name
        try:
            answer = clients.call("read a guest attribute", clients.clients().instances.get_guest_attributes, request={
                "project": self.project, "zone": self.zone, "instance": worker0, "variable_key": ERROR_ATTRIBUTE})
        except Exception:  # not written yet (404), or unreadable: not said
            return None
        return answer.variable_value

    def say_idle_problem(self, wait: float = 5.0) -> None:
        """At launch: once the watchdog has checked it may delete the slice, warn if it may not."""
        deadline = time.monotonic() + wait
        while (problem := self.read_idle_problem()) is None and time.monotonic() < deadline:
            shared.pause(0.1)
        if problem:
            report.warn(gcp_errors.idle_problem_message(self.name, self.project, problem, compute=True,
                                                        boot=not self.idle_seconds))

    # -- the rest --------------------------------------------------------------------------

    def status(self) -> dict:
        problem = self.idle_problem()
        return {"health": None, "uptime_s": None, "usd_per_hour": self.price_per_hour,
                "idle_delete_failing": f"idle delete failing: {problem}" if problem else None}

    def delete(self) -> None:
        self.close()
        self._delete(self.record)
