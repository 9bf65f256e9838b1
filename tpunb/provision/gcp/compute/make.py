"""Making one slice's Compute Engine resources in one zone, in order, each waited for (the
workload policy, the instance template and the BULK MIG; or the instance), then waiting until
the slice is up: a MIG stable with its topology ACTIVE and every VM RUNNING with no current
action (bulk.py), a VM RUNNING. Flex-start waits for capacity: a PENDING VM, or an empty MIG
sized up. Every name is checked before anything is made (claims.py), and whatever stops it part
way, the caller deletes what this launch made (delete.py, by its launch token)."""
from __future__ import annotations

import time

from tpunb import catalog
from tpunb.errors import ProvisionError
from tpunb.provision.gcp import api
from tpunb.provision.gcp.compute import claims, clients
from tpunb.provision.gcp.compute.bodies import VmSpec, instance, mig, template, workload_policy
from tpunb.provision.gcp.compute.bulk import WAITING, wait_up

__all__ = ["WAITING", "make_resources"]


def make_resources(project: str, vm: VmSpec, say, deadline: float, more_zones: bool = False) -> None:
    """The resources, in order, each waited for; then until the slice is up (whatever stops it part
    way, ``teardown`` deletes what this launch made). ``more_zones``: another zone is left to try
    (a BULK MIG refused for capacity then gives up here at once)."""
    c, region = clients.clients(), catalog.region_of(vm.zone)
    claims.check_free(project, vm.zone, vm.name, vm.launch)

    def create(what: str, insert, **where) -> None:
        say(f"creating its {what}", 0.0)
        try:
            operation = clients.call(f"create the {what}", insert, project=project, **where)
        except ProvisionError as exc:
            if exc.reason == claims.TAKEN:  # another launch took the name since the look
                raise claims.taken(project, vm.zone, vm.name, vm.launch) from None
            raise
        clients.wait(project, operation, f"create the {what}", deadline, vm.shape.accelerator, bool(vm.flex_hours))

    if vm.shape.multi_host:
        create("workload policy", c.policies.insert_unary, region=region, resource_policy_resource=workload_policy(vm))
        create("instance template", c.templates.insert_unary, region=region, instance_template_resource=template(vm))
        create(f"MIG of {vm.shape.vms} VMs", c.migs.insert_unary, zone=vm.zone,
               instance_group_manager_resource=mig(vm, project))
        claims.check_alone(project, vm.zone, vm.name, vm.launch, multi_host=True)
        if vm.flex_hours:  # made empty: sized up, it waits for capacity for all its VMs at once (BULK)
            create("flex-start request (the MIG resized)", c.migs.resize_unary, zone=vm.zone,
                   instance_group_manager=vm.name, size=vm.shape.vms)
        wait_up(project, vm.zone, vm.name, say, deadline, bool(vm.flex_hours), more_zones,
                clients.more("quota", project, vm.shape.accelerator))
    else:
        create("VM", c.instances.insert_unary, zone=vm.zone, instance_resource=instance(vm))
        claims.check_alone(project, vm.zone, vm.name, vm.launch, multi_host=False)
        _wait_running(project, vm.zone, vm.name, say, deadline)


def _wait_running(project: str, zone: str, name: str, say, deadline: float) -> None:
    """Until the VM is RUNNING; a flex-start VM is PENDING while it waits for capacity, and gone
    (without an error, field reports say) once its requestValidForDuration passes without any."""
    from google.api_core import exceptions

    c = clients.clients()
    for delay in api.poll_delays():
        try:
            status = clients.call("read the VM", c.instances.get, project=project, zone=zone, instance=name).status
        except exceptions.NotFound:
            raise ProvisionError(f"no capacity came for {name} before its flex-start request expired (--timeout, at most "
                                 "2 h for one VM)", reason="timeout") from None
        say(WAITING if status == "PENDING" else f"VM {status}", 0.0)
        if status == "RUNNING":
            return
        if status in ("TERMINATED", "STOPPED", "SUSPENDED") or time.monotonic() > deadline:
            raise ProvisionError(f"the VM {name} is {status}, not RUNNING", reason="failed")
        api.pause(delay)
