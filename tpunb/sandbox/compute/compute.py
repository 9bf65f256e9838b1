"""The sandbox's Compute Engine API: TPU VM instances, instance templates, workload policies and
BULK MIGs as a state machine on the emulator's clock (its lock, its timings, its host pool).

A single instance goes PROVISIONING -> STAGING -> RUNNING (its insert operation ends then). A MIG
whose workload policy names a topology makes all its VMs at once, when the host pool holds them
all (BULK), and is stable once every one is RUNNING with no current action, its applied topology
ACTIVE. Deletes go STOPPING -> gone. The rules field reports show (docs/cloud-facts.md) are
checked on the way in; compute_checks.py refuses what compute v1 does not define."""
from __future__ import annotations

import base64
import secrets
import signal
import threading
import time
from typing import Any

from tpunb import catalog
from tpunb.sandbox.compute import compute_project
from tpunb.sandbox import quotas
from tpunb.sandbox.compute import machines
from tpunb.sandbox.compute.compute_checks import ComputeError, check_body, check_name, in_use, invalid, matches, not_found
from tpunb.sandbox.compute.compute_migs import MigSide
from tpunb.sandbox.compute.compute_records import ComputeOperation, Core, Mig, Stored, Vm, link, ref, short
from tpunb.sandbox.compute.machines import compute_zones, machine_types_in

#: what the admin can turn on: MIGs that never fill (everywhere or in zones; what listErrors shows), the allowlist,
#: inserts held until that many wait (overlapping launches), a topology that fails (everywhere or in zones; its
#: code and message), topology activation that takes seconds after every VM runs, VMs that publish a host key
#: their sshd does not present (not the VM Compute Engine says it is), machine types hidden from the project
FAULTS = ("unstable", "unstable_code", "unstable_message", "allowlisted", "reservations", "quotas", "hold_inserts",
          "topology_failed", "topology_code", "topology_message", "activation_seconds", "forged_host_keys",
          "hidden_types", *compute_project.FAULTS)
#: a flex-start VM's requestValidForDuration bounds, as field reports quote the refusal
FLEX_WAIT = (90, 7200)
#: machine types flex-start never granted in field reports (tried 4 times, 2026-07)
NEVER_FLEX = ("ct6e-standard-8t",)
#: the organisation policy whose refusal of a VM without Secure Boot field reports quote (TPU images lack it)
SHIELDED_VM = "constraints/compute.requireShieldedVm"


class ComputeEngine(MigSide):
    """Every Compute Engine resource of every project; runs under the emulator's lock."""

    def __init__(self, emu: Core) -> None:
        self.emu = emu
        self.instances: dict[str, Vm] = {}
        self.migs: dict[str, Mig] = {}
        self.templates: dict[str, Stored] = {}
        self.policies: dict[str, Stored] = {}
        self.operations: dict[str, ComputeOperation] = {}
        self.faults: dict[str, Any] = {}
        self._changed = threading.Condition(emu._lock)
        self._held = 0  # inserts waiting for the admin's hold_inserts

    def set_faults(self, changes: dict) -> dict:
        """Merge Compute Engine faults (``FAULTS``); a false or null value turns one off."""
        unknown = sorted(set(changes) - set(FAULTS))
        if unknown:
            raise invalid(f"unknown Compute Engine fault {unknown[0]!r}; known: {', '.join(FAULTS)}")
        self.faults.update(changes)
        for key in [k for k, v in self.faults.items() if v in (None, False)]:
            del self.faults[key]
        if "hold_inserts" in changes:
            self._held = 0
        return dict(self.faults)

    def hold(self) -> None:
        """The admin's ``hold_inserts`` N: each insert waits (the lock let go) until N inserts wait,
        then all go on, one at a time as ever: launches that looked before either made anything."""
        wanted = int(self.faults.get("hold_inserts") or 0)
        if wanted < 2:
            return
        self._held += 1
        self._changed.notify_all()
        deadline = time.monotonic() + 30.0
        while self._held < wanted and time.monotonic() < deadline:
            self._changed.wait(min(0.5, deadline - time.monotonic()))
        self.faults.pop("hold_inserts", None)  # the next inserts go at once

    # -- operations -------------------------------------------------------------------------

    def _operation(self, project: str, scope: str, kind: str, target: str, target_id: str) -> ComputeOperation:
        op = ComputeOperation(project, scope, kind, target, target_id)
        self.operations[op.path] = op
        return op

    def _finish(self, op: ComputeOperation, error: ComputeError | None = None) -> None:
        op.finish(error.operation_error() if error else None, (error.http, error.message) if error else None)
        self._changed.notify_all()

    def get_operation(self, project: str, scope: str, name: str) -> dict:
        path = f"projects/{project}/{scope}/operations/{name}"
        op = self.operations.get(path)
        if op is None:
            raise not_found(path)
        return op.to_json()

    def wait_operation(self, project: str, scope: str, name: str, timeout: float = 120.0) -> dict:
        """operations.wait: the operation once DONE, or as it is after about two minutes."""
        op = self.operations.get(f"projects/{project}/{scope}/operations/{name}")
        if op is None:
            raise not_found(f"projects/{project}/{scope}/operations/{name}")
        deadline = time.monotonic() + timeout
        while not op.done and time.monotonic() < deadline:
            self._changed.wait(min(0.5, deadline - time.monotonic()))
            self.emu.advance()
        return op.to_json()

    # -- zones, machine types ---------------------------------------------------------------

    def check_zone(self, project: str, zone: str) -> None:
        if zone not in compute_zones() and zone not in catalog.zones():
            raise not_found(f"projects/{project}/zones/{zone}")

    def _machine_type(self, project: str, zone: str, value: Any, field: str) -> machines.MachineType:
        name = short(value or "")
        found = machines.machine_types().get(name)
        if name in (self.faults.get("hidden_types") or ()):
            found = None  # not offered to this project at all
        if found is None or found not in machine_types_in(zone):
            offered = [z for z in compute_zones() if found in machine_types_in(z)] if found else []
            hint = f" It is offered in {', '.join(offered)}." if offered else ""
            raise invalid(f"Invalid value for field '{field}': '{value}'. Machine type with name '{name}' does not "
                          f"exist in zone '{zone}'.{hint}")
        return found

    def _check_capacity_rules(self, project: str, machine: machines.MachineType, properties: dict,
                              zone: str = "") -> None:
        """TPU7x Spot and Flex-start need the project on Google's allowlist (tpu-machines' footnote);
        Flex-start needs maxRunDuration; a named reservation must take these VMs (compute_project.py);
        an organisation that requires Shielded VM refuses them all (TPU images lack Secure Boot)."""
        scheduling = properties.get("scheduling") or {}
        model = scheduling.get("provisioningModel", "STANDARD")
        if machine.generation == "tpu7x" and model in ("SPOT", "FLEX_START") and not self.faults.get("allowlisted"):
            raise ComputeError(403, "forbidden", f"{model} provisioning of {machine.name} is restricted by an "
                               f"allowlist; project {project} is not on it. Contact your account team.")
        if model == "FLEX_START" and not scheduling.get("maxRunDuration"):
            raise invalid("Invalid value for field 'resource.scheduling.maxRunDuration': ''. FLEX_START instances "
                          "require maxRunDuration.")
        compute_project.check_consumption(self.faults, project, zone, properties)
        if SHIELDED_VM in getattr(getattr(self.emu, "accounts", None), "enforced", ()):
            raise ComputeError(412, "conditionNotMet", f"Constraint {SHIELDED_VM} violated for project "
                               f"projects/{project}. Secure Boot is not enabled in the 'shielded_instance_config' "
                               "field. See https://cloud.google.com/resource-manager/docs/organization-policy/"
                               "org-policy-constraints for more information.")

    def _quota_error(self, zone: str, machine: machines.MachineType, properties: dict,
                     vms: int = 1) -> ComputeError | None:
        """QUOTA_EXCEEDED when ``vms`` more VMs would pass Compute Engine's own TPU quota in the region
        (quotas.py: its pool, not the Cloud TPU API's), or the quota fault is on there."""
        model = (properties.get("scheduling") or {}).get("provisioningModel", "STANDARD")
        metric, region = quotas.compute_quota_id(machine.generation, model), catalog.region_of(zone)
        value = 0 if self.emu.faults.quota_in(zone) else quotas.limit(self.faults, metric, region)
        if value is not None and (value < 0 or self._chips_spent(metric, region) + vms * machine.chips <= value):
            return None
        limit = float(value or 0)
        info = {"metricName": quotas.metric_name("compute.googleapis.com", metric), "limitName": metric,
                "dimensions": {"region": region}, "limit": limit}
        return ComputeError(403, "QUOTA_EXCEEDED", f"Quota '{metric}' exceeded. Limit: {limit} in region {region}.",
                            [{"quotaInfo": info}])

    def _chips_spent(self, metric: str, region: str) -> int:
        """The chips the region's VMs already spend of quota ``metric``."""
        spent = 0
        for vm in self.instances.values():
            machine = machines.machine_type(vm.machine_type)
            model = (vm.properties.get("scheduling") or {}).get("provisioningModel", "STANDARD")
            if catalog.region_of(vm.zone) == region and quotas.compute_quota_id(machine.generation, model) == metric:
                spent += machine.chips
        return spent

    # -- instances --------------------------------------------------------------------------

    def insert_instance(self, project: str, zone: str, body: dict) -> dict:
        self.hold()
        self.check_zone(project, zone)
        check_body("Instance", body)
        name = check_name(body.get("name"), "instance")
        machine = self._machine_type(project, zone, body.get("machineType"), "resource.machineType")
        for policy in body.get("resourcePolicies") or []:
            stored = self.policies.get(ref(policy, project, "resourcePolicies", "resource.resourcePolicies"))
            if stored is not None and "workloadPolicy" in stored.body:
                raise invalid("Resource policy must have one of [VmMaintenancePolicy, GroupPlacementPolicy, "
                              "InstanceSchedulePolicy]")
        self._check_capacity_rules(project, machine, body, zone)
        compute_project.check_nic(self.faults, project, catalog.region_of(zone), _nic(body))
        vm = Vm(project, zone, name, machine.name, body)
        if vm.path in self.instances:
            raise ComputeError(409, "alreadyExists", f"The resource '{vm.path}' already exists")
        op = self._operation(project, f"zones/{zone}", "insert", vm.path, vm.id)
        quota = self._quota_error(zone, machine, body)
        if not quota and (body.get("scheduling") or {}).get("provisioningModel") == "FLEX_START":
            return self._pending(vm, machine, op)  # the Dynamic Workload Scheduler's queue, even when capacity is there
        endpoint = None if quota or self.emu.faults.stockout(zone) else self._allocate(vm, machine)
        if endpoint is None:
            error = quota or ComputeError(503, "ZONE_RESOURCE_POOL_EXHAUSTED", f"The zone 'projects/{project}/"
                                          f"zones/{zone}' does not have enough resources available to fulfill "
                                          "the request. Try a different zone, or try again later.")
            self.emu.at(self.emu.timings.create_seconds / 2, self._finish, op, error)
            return op.to_json()
        self.instances[vm.path] = vm
        self._start(vm, op)
        return op.to_json()

    def _pending(self, vm: Vm, machine: machines.MachineType, op: ComputeOperation) -> dict:
        """A flex-start VM: PENDING (its insert accepted and RUNNING until the VM is, unverified: the
        harsher reading of gcloud blocking until provisioning ends), tried every queue_seconds, gone
        without an error once requestValidForDuration passes (field reports)."""
        wait = int(((vm.properties.get("params") or {}).get("requestValidForDuration") or {}).get("seconds") or FLEX_WAIT[1])
        if not FLEX_WAIT[0] <= wait <= FLEX_WAIT[1]:
            del self.operations[op.path]
            raise invalid(f"Invalid value for field 'resource.params.requestValidForDuration': '{wait}s'. Request "
                          f"valid for duration must be at least {FLEX_WAIT[0]} and less or equal to {FLEX_WAIT[1]} seconds.")
        vm.status, vm.current_action = "PENDING", "CREATING"
        self.instances[vm.path] = vm
        self.emu.at(self.emu.timings.queue_seconds, self._grant, vm, machine, op)
        self.emu.at(wait, self._expire, vm, op)
        return op.to_json()

    def _grant(self, vm: Vm, machine: machines.MachineType, op: ComputeOperation) -> None:
        """Capacity for a PENDING flex-start VM: its insert ends once it RUNs. A ct6e-standard-8t is
        never granted so (field reports: 0 of 4 tries, each INTERNAL_ERROR after minutes in STAGING,
        the VM gone): it goes STAGING, then fails."""
        if self.instances.get(vm.path) is not vm or vm.status != "PENDING":
            return
        if machine.name in NEVER_FLEX:
            vm.status = "STAGING"
            self.emu.at(self.emu.timings.create_seconds, self._flex_failed, vm, op)
            return
        if self.emu.faults.stockout(vm.zone) or self._allocate(vm, machine) is None:
            self.emu.at(self.emu.timings.queue_seconds, self._grant, vm, machine, op)
            return
        vm.status = "PROVISIONING"
        self._start(vm, op)

    def _flex_failed(self, vm: Vm, op: ComputeOperation) -> None:
        if self.instances.get(vm.path) is vm:
            del self.instances[vm.path]
        self._finish(op, ComputeError(500, "INTERNAL_ERROR", "Internal error. Please try again or contact Google "
                                      "Support. (Code: '-5712461278347811234')"))

    def _expire(self, vm: Vm, op: ComputeOperation) -> None:
        """requestValidForDuration passed without capacity: the VM is gone, its insert done without an
        error (field reports: it "disappears without an error")."""
        if self.instances.get(vm.path) is vm and vm.status == "PENDING":
            del self.instances[vm.path]
            self._finish(op)

    def _allocate(self, vm: Vm, machine: machines.MachineType):
        found = self.emu.hosts.allocate(vm.path, 1, bool(_nic(vm.properties).get("accessConfigs")))
        if not found:
            return None
        vm.endpoint = found[0]
        vm.host_key = self.emu.hosts.rekey(vm.endpoint.internal_ip)  # a new VM: a host key of its own
        try:
            self.emu.hosts.configure(vm.endpoint.internal_ip, python=machine.python,
                                     devices=machine.jax_devices, names={**self.host_names(), vm.name: vm.endpoint.internal_ip},
                                     egress=compute_project.egress(self.faults, vm.project, vm.zone, _nic(vm.properties)))
        except ValueError as e:  # the sandbox lacks this image's Python: say so, keep the host free
            self.emu.hosts.release(vm.path)
            raise ComputeError(500, "internalError", f"The sandbox cannot make {machine.name} VMs: {e}") from None
        return vm.endpoint

    def host_names(self) -> dict[str, str]:
        """Instance name -> address, for every instance holding a host (what the hosts' resolver knows)."""
        return {vm.name: vm.endpoint.internal_ip for vm in self.instances.values() if vm.endpoint}

    def _start(self, vm: Vm, op: ComputeOperation | None = None) -> None:
        """PROVISIONING -> STAGING -> RUNNING, then the VM boots (its startup-script runs)."""
        create = self.emu.timings.create_seconds + self.emu.faults.slow_create
        self.emu.at(create / 2, self._staging, vm)
        self.emu.at(create, self._running, vm, op)

    def _staging(self, vm: Vm) -> None:
        if self.instances.get(vm.path) is vm and vm.status == "PROVISIONING":
            vm.status = "STAGING"

    def _running(self, vm: Vm, op: ComputeOperation | None) -> None:
        if self.instances.get(vm.path) is not vm or vm.status not in ("PROVISIONING", "STAGING"):
            if op is not None:  # deleted while being made: its insert ends (unverified how; harsher: no error)
                self._finish(op)
            return
        vm.status, vm.current_action = "RUNNING", "NONE"
        if vm.host_key and vm.metadata.get("enable-guest-attributes", "").upper() == "TRUE":
            kind, key = vm.host_key.split()[:2]  # the guest agent publishes its host keys (gcloud's ssh reads them)
            if self.faults.get("forged_host_keys"):
                key = base64.b64encode(b"\0\0\0\x0bssh-ed25519\0\0\0 " + secrets.token_bytes(32)).decode()
            vm.guest_attributes[f"hostkeys/{kind}"] = key
        self.emu.sync_vm_logins(vm.path, vm)
        self.emu.hosts.boot(vm.endpoint.internal_ip, vm.metadata.get("startup-script", ""))
        if op is not None:
            self._finish(op)
        self._changed.notify_all()

    def slice_of(self, vm: Vm) -> tuple[list[Vm], str]:
        """The VMs of ``vm``'s slice in worker order (its MIG's, or itself) and the slice's topology."""
        mig = self.migs.get(vm.mig)
        if mig is None:
            return [vm], machines.machine_type(vm.machine_type).topology
        peers = sorted((self.instances[p] for p in mig.vms if p in self.instances), key=lambda v: v.worker)
        return peers, mig.topology or machines.machine_type(vm.machine_type).topology

    def get_instance(self, project: str, zone: str, name: str) -> dict:
        return self._vm(project, zone, name).to_json(self.emu.hosts.ssh_port)

    def _vm(self, project: str, zone: str, name: str) -> Vm:
        self.check_zone(project, zone)
        vm = self.instances.get(f"projects/{project}/zones/{zone}/instances/{name}")
        if vm is None:
            raise not_found(f"projects/{project}/zones/{zone}/instances/{name}")
        return vm

    def list_instances(self, project: str, zone: str, filter: str = "") -> dict:
        self.check_zone(project, zone)
        items = [v.to_json(self.emu.hosts.ssh_port) for v in self.instances.values() if (v.project, v.zone) == (project, zone)]
        return _listing("compute#instanceList", f"projects/{project}/zones/{zone}/instances",
                        [i for i in items if matches(i, filter)])

    def aggregated_instances(self, project: str, filter: str = "") -> dict:
        items: dict[str, dict] = self._unreachable()
        for vm in self.instances.values():
            body = vm.to_json(self.emu.hosts.ssh_port)
            if vm.project == project and matches(body, filter) and "warning" not in items.get(f"zones/{vm.zone}", {}):
                items.setdefault(f"zones/{vm.zone}", {"instances": []})["instances"].append(body)
        return {"kind": "compute#instanceAggregatedList", "id": f"projects/{project}/aggregated/instances",
                "items": items, "selfLink": link(f"projects/{project}/aggregated/instances")}

    def _unreachable(self) -> dict[str, dict]:
        """The scopes an aggregatedList could not reach (the emulator's ``unreachable`` fault, zones):
        each with a warning instead of its items (compute v1's ``Warning.code`` UNREACHABLE)."""
        return {f"zones/{z}": {"warning": {"code": "UNREACHABLE", "message": f"Scope 'zones/{z}' is unreachable.",
                                           "data": [{"key": "scope", "value": f"zones/{z}"}]}}
                for z in self.emu.faults.unreachable or ()}

    def aggregated(self, project: str, kind: str, filter: str = "") -> dict:
        """aggregatedList of MIGs, templates (global ones under "global") or resource policies:
        ``{"items": {"zones/Z" | "regions/R" | "global": {kind: [...]}}}``, the scopes with a match only."""
        if kind == "instanceGroupManagers":
            found = [(f"zones/{m.zone}", self.mig_json(m)) for m in self.migs.values() if m.project == project]
        else:
            table = self.templates if kind == "instanceTemplates" else self.policies
            found = [("/".join(s.path.split("/")[2:4]) if s.path.split("/")[2] == "regions" else "global", s.to_json())
                     for s in table.values() if s.path.split("/")[1] == project]
        items: dict[str, dict] = self._unreachable()
        for scope, body in found:
            if matches(body, filter) and "warning" not in items.get(scope, {}):
                items.setdefault(scope, {kind: []})[kind].append(body)
        path = f"projects/{project}/aggregated/{kind}"
        return {"kind": f"compute#{kind[:-1]}AggregatedList", "id": path, "items": items, "selfLink": link(path)}

    def set_metadata(self, project: str, zone: str, name: str, body: dict) -> dict:
        """instances.setMetadata: the instance's own metadata replaced, if the caller read the
        current one (its fingerprint); a RUNNING VM's guest agent applies ``ssh-keys`` at once."""
        check_body("Metadata", body)
        vm = self._vm(project, zone, name)
        if body.get("fingerprint") != vm.fingerprint:
            raise ComputeError(412, "conditionNotMet", "Supplied fingerprint does not match current metadata "
                               "fingerprint.")
        items = [i for i in body.get("items") or [] if i.get("key") != "created-by"]  # the MIG's, not the VM's own
        vm.properties = {**vm.properties, "metadata": {"items": items}}  # a MIG's VMs share their template's
        op = self._operation(project, f"zones/{zone}", "setMetadata", vm.path, vm.id)
        if vm.status == "RUNNING":
            self.emu.sync_vm_logins(vm.path, vm)
        self._finish(op)
        return op.to_json()

    def delete_instance(self, project: str, zone: str, name: str) -> dict:
        vm = self._vm(project, zone, name)
        op = self._operation(project, f"zones/{zone}", "delete", vm.path, vm.id)
        self._stop(vm, op)
        return op.to_json()

    def _stop(self, vm: Vm, op: ComputeOperation | None = None) -> None:
        vm.status, vm.current_action = "STOPPING", "DELETING"
        self.emu.hosts.remove_keys(vm.path)
        self.emu.at(self.emu.timings.delete_seconds, self._gone, vm, op)

    def _gone(self, vm: Vm, op: ComputeOperation | None) -> None:
        if self.instances.get(vm.path) is vm:
            del self.instances[vm.path]
        self.emu.hosts.release(vm.path)
        if op is not None:
            self._finish(op)
        mig = self.migs.get(vm.mig)
        if mig is not None and vm.path in mig.vms and not mig.deleting:  # the MIG makes it again
            try:
                self.recreate(vm.name, vm)
            except ComputeError as e:  # on the clock: a VM it cannot make is an error the MIG lists
                mig.errors.append({"error": {"code": e.reason, "message": e.message},
                                   "instanceActionDetails": {"action": "RECREATING", "instance": link(vm.path)}})
        self._changed.notify_all()

    def find(self, ref: str) -> Vm | None:
        """An instance by name or path (the admin's handle on it)."""
        return next((v for v in self.instances.values() if ref in (v.name, v.path)), None)

    def preempt(self, ref: str, after: float = 0.0, notice: float = 30.0) -> dict:
        """Reclaim a VM as Compute Engine reclaims Spot capacity: ``after`` seconds from now the
        notice (metadata ``instance/preempted`` TRUE, SIGTERM to its processes, its sshd sessions
        dropped), ``notice`` seconds later it is TERMINATED and every process of it killed."""
        vm = self.find(ref)
        if vm is None:
            raise not_found(ref)
        if notice > 0:
            self.emu.at(after, self._notice, vm, notice)
        self.emu.at(after + notice, self._preempted, vm)
        self.emu.advance()
        return {"instance": vm.path, "state": "TERMINATED", "after": after, "notice": notice}

    def _notice(self, vm: Vm, window: float) -> None:
        """Spot's notice: the guest's shutdown begins; the VM is TERMINATED when the window ends, or
        sooner once its last process has ended (the guest halted)."""
        if self.instances.get(vm.path) is vm and vm.status == "RUNNING":
            vm.noticed = True
            self.emu.hosts.shut_down([vm.endpoint.internal_ip], window, lambda: self.emu.call_soon(self._preempted, vm))

    def _preempted(self, vm: Vm) -> None:
        if self.instances.get(vm.path) is not vm or vm.status in ("STOPPING", "TERMINATED"):
            return
        vm.status, vm.noticed = "TERMINATED", True
        self.emu.hosts.remove_keys(vm.path)
        self.emu.hosts.signal_processes(vm.endpoint.internal_ip, signal.SIGKILL)
        self._changed.notify_all()

    def recreate(self, name: str, gone: Vm | None = None) -> dict:
        """What a MIG does to one of its VMs (an admin fault, or a VM deleted under it): a new VM of
        the same name and worker id on a new host, RECREATING until RUNNING."""
        old = gone or next((v for v in self.instances.values() if v.mig and name in (v.name, v.path)), None)
        if old is None:
            raise not_found(f"instances/{name} of a MIG")
        if gone is None:
            del self.instances[old.path]
            self.emu.hosts.release(old.path)
        vm = Vm(old.project, old.zone, old.name, old.machine_type, old.properties, old.mig, old.worker,
                status="STAGING", current_action="RECREATING")
        if self._allocate(vm, machines.machine_type(vm.machine_type)) is None:
            raise ComputeError(503, "ZONE_RESOURCE_POOL_EXHAUSTED", "no free host to recreate the instance on")
        self.instances[vm.path] = vm
        self._start(vm)
        return {"instance": vm.path, "id": vm.id, "address": vm.endpoint.internal_ip}

    def guest_attributes(self, project: str, zone: str, name: str, query_path: str = "", key: str = "") -> dict:
        """instances.getGuestAttributes: one key (``variableKey``) or every key under ``queryPath``."""
        vm = self._vm(project, zone, name)
        if vm.metadata.get("enable-guest-attributes", "").upper() != "TRUE":
            raise ComputeError(400, "badRequest", "Guest attributes are disabled for this instance: set "
                               "metadata enable-guest-attributes=TRUE.")
        out: dict[str, Any] = {"kind": "compute#guestAttributes", "selfLink": link(vm.path + "/getGuestAttributes")}
        if key:
            if key not in vm.guest_attributes:
                raise not_found(f"{vm.path}/guestAttributes/{key}")
            return {**out, "variableKey": key, "variableValue": vm.guest_attributes[key]}
        items = [{"namespace": k.split("/", 1)[0], "key": k.split("/", 1)[1], "value": v}
                 for k, v in sorted(vm.guest_attributes.items()) if k.startswith(query_path.strip("/"))]
        if not items:  # as gcloud's ssh quotes it: nothing there is a 404
            raise ComputeError(404, "notFound", f"The resource '{query_path}' of type 'Guest Attribute' was not found.")
        return {**out, "queryPath": query_path, "queryValue": {"items": items}}

    # -- templates and resource policies ----------------------------------------------------

    def insert_stored(self, project: str, scope: str, kind: str, body: dict) -> dict:
        """instanceTemplates.insert (regional or global) and resourcePolicies.insert."""
        message = {"instanceTemplates": "InstanceTemplate", "resourcePolicies": "ResourcePolicy"}[kind]
        self.hold()
        if scope != "global":
            self._check_region(project, scope.split("/")[1])
        check_body(message, body)
        path = f"projects/{project}/{scope}/{kind}/{check_name(body.get('name'), kind)}"
        table = self.templates if kind == "instanceTemplates" else self.policies
        if kind == "resourcePolicies":
            _check_workload_policy(body.get("workloadPolicy"))
        elif not (body.get("properties") or {}).get("machineType"):
            raise invalid("Invalid value for field 'resource.properties.machineType': ''. A machine type is required.")
        elif scope != "global":
            compute_project.check_nic(self.faults, project, scope.split("/")[1], _nic(body["properties"]))
        if path in table:
            raise ComputeError(409, "alreadyExists", f"The resource '{path}' already exists")
        stored = table[path] = Stored(path, body, f"compute#{message[0].lower()}{message[1:]}")
        op = self._operation(project, scope, "insert", path, stored.id)
        self._finish(op)
        return op.to_json()

    def _check_region(self, project: str, region: str) -> None:
        if region not in {catalog.region_of(z) for z in compute_zones() + catalog.zones()}:
            raise not_found(f"projects/{project}/regions/{region}")

    def _stored(self, project: str, scope: str, kind: str, name: str) -> Stored:
        path = f"projects/{project}/{scope}/{kind}/{name}"
        found = (self.templates if kind == "instanceTemplates" else self.policies).get(path)
        if found is None:
            raise not_found(path)
        return found

    def get_stored(self, project: str, scope: str, kind: str, name: str) -> dict:
        return self._stored(project, scope, kind, name).to_json()

    def list_stored(self, project: str, scope: str, kind: str, filter: str = "") -> dict:
        table = self.templates if kind == "instanceTemplates" else self.policies
        prefix = f"projects/{project}/{scope}/{kind}/"
        items = [s.to_json() for p, s in table.items() if p.startswith(prefix)]
        return _listing(f"compute#{kind[:-1]}List", prefix.rstrip("/"), [i for i in items if matches(i, filter)])

    def delete_stored(self, project: str, scope: str, kind: str, name: str) -> dict:
        stored = self._stored(project, scope, kind, name)
        users = [m.path for m in self.migs.values() if stored.path in (m.template, m.policy)]
        users += [v.path for v in self.instances.values()
                  if any(stored.path in str(p) for p in v.properties.get("resourcePolicies") or [])]
        if users:
            raise in_use({"instanceTemplates": "instance_template", "resourcePolicies": "resource_policy"}[kind],
                         stored.path, users[0])
        (self.templates if kind == "instanceTemplates" else self.policies).pop(stored.path)
        op = self._operation(project, scope, "delete", stored.path, stored.id)
        self._finish(op)
        return op.to_json()

    # -- reset and state ---------------------------------------------------------------------

    def reset(self) -> None:
        for vm in self.instances.values():
            self.emu.hosts.release(vm.path)
        for table in (self.instances, self.migs, self.templates, self.policies, self.operations, self.faults):
            table.clear()

    def snapshot(self) -> dict:
        return {"instances": [dict(v.to_json(), worker=v.worker, mig=v.mig) for v in self.instances.values()],
                "instanceGroupManagers": [m.path for m in self.migs.values()],
                "instanceTemplates": list(self.templates), "resourcePolicies": list(self.policies),
                "pendingOperations": [p for p, o in self.operations.items() if not o.done], "faults": dict(self.faults)}


def _check_workload_policy(policy: dict | None) -> None:
    """HIGH_THROUGHPUT alone takes an accelerator topology; maxTopologyDistance excludes it (gcloud's
    workload-policy flags)."""
    if not policy:
        return
    if policy.get("acceleratorTopology") and policy.get("type") != "HIGH_THROUGHPUT":
        raise invalid("Invalid value for field 'resource.workloadPolicy.acceleratorTopology': an accelerator "
                      "topology needs type HIGH_THROUGHPUT.")
    if policy.get("acceleratorTopology") and policy.get("maxTopologyDistance"):
        raise invalid("Invalid value for field 'resource.workloadPolicy': acceleratorTopology and "
                      "maxTopologyDistance cannot both be set.")


def _nic(properties: dict) -> dict:
    return (properties.get("networkInterfaces") or [{}])[0]


def _listing(kind: str, path: str, items: list[dict]) -> dict:
    return {"kind": kind, "id": path, "selfLink": link(path), **({"items": items} if items else {})}
