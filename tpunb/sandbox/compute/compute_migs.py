"""Zonal managed instance groups of the sandbox's Compute Engine: a base class of ComputeEngine
(compute.py), whose instances, templates, policies, operations and clock it uses.

A MIG whose workload policy names an accelerator topology is a TPU slice: it must be BULK
(field reports quote ``MIGs with TPU accelerator topology require BULK mode in target size
policy``), its size is the topology's VMs (or 0, to be resized later: the flex path), and it
makes every VM at once or none, retrying while the pool (or a fault, or a quota) refuses: Google's
BULK keeps waiting on QUOTA_EXCEEDED too. Each try that fails leaves an entry in ``listErrors`` and
is the MIG's ``bulkInstanceOperation.lastProgressCheck.error``; meanwhile it lists the VMs it will
make, each with a name and a URL but no status and no id (flex-start ones PENDING). Its applied
topology is ACTIVATING until every VM runs (and the admin's ``activation_seconds`` more), then
ACTIVE; INCOMPLETE once a VM it made is gone; FAILED when the admin says so (records.py, Mig).
Worker ids are dealt at random against the VMs' names: only each VM's metadata says which worker
it is, as on Compute Engine."""
from __future__ import annotations

import random
import string
import time
from typing import Any

from tpunb.sandbox.compute import machines
from tpunb import catalog
from tpunb.sandbox.compute.compute_checks import ComputeError, check_body, check_name, invalid, matches, not_found
from tpunb.sandbox.compute.compute_records import ComputeOperation, Core, Mig, Stored, Vm, link, ref, timestamp

BULK_REQUIRED = "MIGs with TPU accelerator topology require BULK mode in target size policy"
NO_RESIZE_REQUESTS = "Creating resize requests for managed instance group with TPU is not allowed"


def vms_for(topology: str, machine: machines.MachineType) -> int:
    """How many VMs of ``machine`` a workload policy's topology takes (chips / chips per VM), 0 if
    the machine type cannot make that topology."""
    try:
        acc = catalog.from_topology(machine.generation, topology)
    except catalog.UnknownAcceleratorError:
        return 0
    if acc.chips % machine.chips or (acc.chips == machine.chips and topology != machine.topology):
        return 0
    return acc.chips // machine.chips


class MigSide:
    """instanceGroupManagers.* and resizeRequests.insert."""

    emu: Core
    instances: dict[str, Vm]
    migs: dict[str, Mig]
    templates: dict[str, Stored]
    policies: dict[str, Stored]
    faults: dict[str, Any]

    def insert_mig(self, project: str, zone: str, body: dict) -> dict:
        self.hold()
        self.check_zone(project, zone)
        check_body("InstanceGroupManager", body)
        name = check_name(body.get("name"), "instanceGroupManager")
        base = body.get("baseInstanceName")
        if base is not None and len(str(base)) > 58:  # compute.proto: "The maximum character length is 58"
            raise invalid(f"Invalid value for field 'resource.baseInstanceName': '{base}'. Must be at most 58 "
                          "characters long.")
        template_path = ref(body.get("instanceTemplate"), project, "instanceTemplates", "resource.instanceTemplate")
        template = self.templates.get(template_path)
        if template is None:
            raise invalid(f"Invalid value for field 'resource.instanceTemplate': '{body.get('instanceTemplate')}'. "
                          "The referenced instanceTemplate resource cannot be found.")
        properties = template.body.get("properties") or {}
        machine = self._machine_type(project, zone, properties.get("machineType"), "resource.instanceTemplate")
        policy_path, topology = self._workload_policy(project, zone, body)
        size = int(body.get("targetSize") or 0)
        if topology:
            if (body.get("targetSizePolicy") or {}).get("mode") != "BULK":
                raise invalid(BULK_REQUIRED)
            vms = vms_for(topology, machine)
            if not vms:
                raise invalid(f"Invalid value for field 'resource.resourcePolicies.workloadPolicy': accelerator "
                              f"topology {topology} cannot be made of {machine.name} VMs.")
            if size not in (0, vms):
                raise invalid(f"Invalid value for field 'resource.targetSize': {size}. Accelerator topology "
                              f"{topology} takes {vms} {machine.name} VMs (or 0, to resize later).")
        self._check_capacity_rules(project, machine, properties, zone)
        mig = Mig(project, zone, name, body, template_path, policy_path, topology, size,
                  flex=(properties.get("scheduling") or {}).get("provisioningModel") == "FLEX_START")
        if mig.path in self.migs:
            raise ComputeError(409, "alreadyExists", f"The resource '{mig.path}' already exists")
        self.migs[mig.path] = mig
        op = self._operation(project, f"zones/{zone}", "insert", mig.path, mig.id)
        self._finish(op)
        self.emu.at(0, self._fill, mig)
        return op.to_json()

    def _workload_policy(self, project: str, zone: str, body: dict) -> tuple[str, str]:
        given = (body.get("resourcePolicies") or {}).get("workloadPolicy")
        if not given:
            return "", ""
        path = ref(given, project, "resourcePolicies", "resource.resourcePolicies.workloadPolicy")
        policy = self.policies.get(path)
        if policy is None or "workloadPolicy" not in policy.body:
            raise invalid(f"Invalid value for field 'resource.resourcePolicies.workloadPolicy': '{given}'. "
                          "The referenced workload policy resource cannot be found.")
        if path.split("/")[3] != catalog.region_of(zone):
            raise invalid(f"Invalid value for field 'resource.resourcePolicies.workloadPolicy': '{given}'. The "
                          f"workload policy must be in the MIG's region {catalog.region_of(zone)}.")
        return path, str(policy.body["workloadPolicy"].get("acceleratorTopology") or "")

    def _fill(self, mig: Mig) -> None:
        """Make the VMs a MIG lacks: all at once, or none and try again later (BULK)."""
        if self.migs.get(mig.path) is not mig or mig.deleting:
            return
        need = mig.target_size - len(mig.vms)
        if need <= 0:
            mig.waiting = False
            return
        template = self.templates[mig.template].body["properties"]
        machine = machines.machine_type(template["machineType"].rsplit("/", 1)[-1])
        base = mig.body.get("baseInstanceName") or mig.name
        while len(mig.planned) < need:  # named from the first try on: listed before they exist
            mig.planned.append(f"{base}-{''.join(random.choices(string.ascii_lowercase + string.digits, k=4))}")
        error = self._quota_error(mig.zone, machine, template, need) or self._refusal(mig, need)
        mig.checked = timestamp()
        if error is not None:
            mig.waiting, mig.bulk_error = True, error.errors()
            mig.errors = (mig.errors + [{"error": {"code": error.reason, "message": error.message},
                                         "instanceActionDetails": {"action": "CREATING"},
                                         "timestamp": timestamp()}])[-20:]
            self.emu.at(self.emu.timings.queue_seconds, self._fill, mig)
            return
        free = sorted(set(range(mig.target_size)) - {self.instances[p].worker for p in mig.vms if p in self.instances})
        random.shuffle(free)
        made: list[Vm] = []
        for worker, name in zip(free[:need], mig.planned):
            vm = Vm(mig.project, mig.zone, name, machine.name, template, mig.path, worker)
            try:
                self._allocate(vm, machine)
            except ComputeError as e:  # a VM this sandbox cannot make: none of them, and listErrors says why
                for each in made:
                    self.emu.hosts.release(each.path)
                mig.errors.append({"error": {"code": e.reason, "message": e.message},
                                   "instanceActionDetails": {"action": "CREATING"}, "timestamp": timestamp()})
                return
            made.append(vm)
        for vm in made:
            self.instances[vm.path] = vm
            mig.vms.append(vm.path)
            self._start(vm)
        mig.vms.sort(key=lambda p: p.rsplit("/", 1)[-1])  # the API lists by name, not by worker
        mig.waiting, mig.bulk_error, mig.planned = False, None, mig.planned[len(made):]

    def _refusal(self, mig: Mig, need: int) -> ComputeError | None:
        unstable = self.faults.get("unstable")
        if unstable is True or (isinstance(unstable, list) and mig.zone in unstable):
            return ComputeError(503, str(self.faults.get("unstable_code") or "ZONE_RESOURCE_POOL_EXHAUSTED"),
                                str(self.faults.get("unstable_message") or "The zone does not have enough "
                                    "resources available to fulfill the request."))
        if self.emu.faults.stockout(mig.zone) or (self.emu.hosts.real and self.emu.hosts.free() < need):
            return ComputeError(503, "ZONE_RESOURCE_POOL_EXHAUSTED", f"The zone 'projects/{mig.project}/zones/"
                                f"{mig.zone}' does not have enough resources available to fulfill the request.")
        return None

    def _mig(self, project: str, zone: str, name: str) -> Mig:
        self.check_zone(project, zone)
        path = f"projects/{project}/zones/{zone}/instanceGroupManagers/{name}"
        if path not in self.migs:
            raise not_found(path)
        return self.migs[path]

    def _mig_vms(self, mig: Mig) -> list[Vm]:
        return [self.instances[p] for p in mig.vms if p in self.instances]

    def mig_json(self, mig: Mig) -> dict:
        vms = self._mig_vms(mig)
        return mig.to_json(vms, self._topology(mig, vms))

    def _topology(self, mig: Mig, vms: list[Vm]) -> tuple[str, dict | None]:
        """Its applied topology's state (and that state's error): see the module's docstring."""
        failed = self.faults.get("topology_failed")
        if failed is True or (isinstance(failed, list) and mig.zone in failed):
            return "FAILED", {"errors": [{"code": str(self.faults.get("topology_code") or "TOPOLOGY_FAILED"),
                                          "message": str(self.faults.get("topology_message") or
                                                         "The accelerator topology could not be formed.")}]}
        if mig.deleting:
            return "DEACTIVATING", None
        running = [v for v in vms if v.status == "RUNNING" and v.current_action == "NONE"]
        if len(running) < mig.target_size or not mig.target_size:
            mig.running_since = None
            made = not mig.waiting and len(vms) == mig.target_size
            settling = any(v.current_action in ("CREATING", "RECREATING") for v in vms)
            return ("INCOMPLETE", None) if made and mig.target_size and not settling else ("ACTIVATING", None)
        if mig.running_since is None:
            mig.running_since = time.monotonic()
        waited = time.monotonic() - mig.running_since
        return ("ACTIVE", None) if waited >= float(self.faults.get("activation_seconds") or 0) else ("ACTIVATING", None)

    def get_mig(self, project: str, zone: str, name: str) -> dict:
        return self.mig_json(self._mig(project, zone, name))

    def list_migs(self, project: str, zone: str, filter: str = "") -> dict:
        self.check_zone(project, zone)
        items = [self.mig_json(m) for m in self.migs.values() if (m.project, m.zone) == (project, zone)]
        items = [i for i in items if matches(i, filter)]
        path = f"projects/{project}/zones/{zone}/instanceGroupManagers"
        return {"kind": "compute#instanceGroupManagerList", "id": path, "selfLink": link(path),
                **({"items": items} if items else {})}

    def list_managed_instances(self, project: str, zone: str, name: str) -> dict:
        mig = self._mig(project, zone, name)
        items = mig.members(self._mig_vms(mig))
        return {"managedInstances": items} if items else {}

    def list_errors(self, project: str, zone: str, name: str) -> dict:
        mig = self._mig(project, zone, name)
        return {"items": list(mig.errors)} if mig.errors else {}

    def resize_mig(self, project: str, zone: str, name: str, size: str) -> dict:
        mig = self._mig(project, zone, name)
        if not str(size).isdigit():
            raise invalid(f"Invalid value for field 'size': '{size}'. Must be a non-negative integer.")
        new = int(size)
        machine = machines.machine_type(self.templates[mig.template].body["properties"]["machineType"].rsplit("/", 1)[-1])
        if mig.topology and new not in (0, vms_for(mig.topology, machine)):
            raise invalid(f"Invalid value for field 'size': {new}. Accelerator topology {mig.topology} takes "
                          f"{vms_for(mig.topology, machine)} {machine.name} VMs (or 0).")
        mig.target_size = new
        for path in list(mig.vms):
            vm = self.instances.get(path)
            if vm is not None and vm.worker >= new:
                mig.vms.remove(path)
                self._stop(vm)
        op = self._operation(project, f"zones/{zone}", "compute.instanceGroupManagers.resize", mig.path, mig.id)
        self._finish(op)
        self.emu.at(0, self._fill, mig)
        return op.to_json()

    def delete_mig(self, project: str, zone: str, name: str) -> dict:
        mig = self._mig(project, zone, name)
        op = self._operation(project, f"zones/{zone}", "delete", mig.path, mig.id)
        mig.deleting = True
        for vm in self._mig_vms(mig):
            self._stop(vm)
        self.emu.at(self.emu.timings.delete_seconds, self._mig_gone, mig, op)
        return op.to_json()

    def _mig_gone(self, mig: Mig, op: ComputeOperation) -> None:
        if self.migs.get(mig.path) is mig:
            del self.migs[mig.path]
        self._finish(op)

    def insert_resize_request(self, project: str, zone: str, name: str, body: dict) -> dict:
        """resizeRequests.insert: refused for a TPU MIG (field reports: the flex path of a slice is a
        BULK MIG resized instead); the sandbox has no other kind of MIG."""
        self._mig(project, zone, name)
        check_body("InstanceGroupManagerResizeRequest", body)
        raise invalid(NO_RESIZE_REQUESTS)
