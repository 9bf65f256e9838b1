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
from tpunb.provision import interrupts
from tpunb.provision.gcp import shared
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

    def create(what: str, insert, wait: bool = True, **where):
        """The insert's operation, waited for unless ``wait`` is false."""
        say(f"creating its {what}", 0.0)
        try:
            # a Ctrl-C waits for the call: then what it made exists, and the caller's teardown finds it
            operation = interrupts.whole(clients.call, f"create the {what}", insert, project=project, **where)
        except ProvisionError as exc:
            if exc.reason == claims.TAKEN:  # another launch took the name since the look
                raise claims.taken(project, vm.zone, vm.name, vm.launch) from None
            raise
        if wait:
            clients.wait(project, operation, f"create the {what}", deadline, flex=bool(vm.flex_hours))
        return operation

    if vm.shape.multi_host:
        create("workload policy", c.policies.insert_unary, region=region, resource_policy_resource=workload_policy(vm))
        create("instance template", c.templates.insert_unary, region=region, instance_template_resource=template(vm))
        create(f"MIG of {vm.shape.vms} VMs", c.migs.insert_unary, zone=vm.zone,
               instance_group_manager_resource=mig(vm, project))
        claims.check_alone(project, vm.zone, vm.name, vm.launch, multi_host=True)
        if vm.flex_hours:  # made empty: sized up, it waits for capacity for all its VMs at once (BULK)
            create("flex-start request (the MIG resized)", c.migs.resize_unary, zone=vm.zone,
                   instance_group_manager=vm.name, size=vm.shape.vms)
        wait_up(project, vm.zone, vm.name, say, deadline, bool(vm.flex_hours), more_zones, clients.more("quota", project))
    elif vm.flex_hours:  # its insert may stay RUNNING until capacity comes (up to 2 h): followed by the VM's status
        operation = create("VM", c.instances.insert_unary, wait=False, zone=vm.zone, instance_resource=instance(vm))
        claims.check_alone(project, vm.zone, vm.name, vm.launch, multi_host=False)
        _wait_running(project, vm.zone, vm.name, say, deadline, operation)
    else:
        create("VM", c.instances.insert_unary, zone=vm.zone, instance_resource=instance(vm))
        claims.check_alone(project, vm.zone, vm.name, vm.launch, multi_host=False)
        _wait_running(project, vm.zone, vm.name, say, deadline)


def _wait_running(project: str, zone: str, name: str, say, deadline: float, flex_op=None) -> None:
    """Until the VM is RUNNING. A flex-start VM (``flex_op``: its insert, read without waiting on
    it) is PENDING while it waits for capacity, and gone once its requestValidForDuration passes
    without any (without an error, field reports say) or its provisioning failed (its insert's
    error says why); an on-demand VM that disappears was deleted while it was being made."""
    from google.api_core import exceptions
    from google.cloud import compute_v1

    c = clients.clients()
    for delay in shared.poll_delays():
        done = flex_op is not None and flex_op.status == compute_v1.Operation.Status.DONE
        if flex_op is not None and not done:
            flex_op = clients.call("read the VM's insert", c.zone_ops.get, project=project, zone=zone,
                                   operation=flex_op.name)
            done = flex_op.status == compute_v1.Operation.Status.DONE
        if done:
            clients.wait(project, flex_op, "create the VM", flex=True)  # done: its error, if any, as one line
        try:
            status = clients.call("read the VM", c.instances.get, project=project, zone=zone, instance=name).status
        except exceptions.NotFound:
            if flex_op is not None and not done and time.monotonic() < deadline:
                shared.pause(delay)  # accepted, not listed yet
                continue
            if flex_op is not None:
                raise ProvisionError(f"no capacity came for {name} before its flex-start request expired (--timeout, "
                                     "at most 2 h for one VM)", reason="timeout") from None
            raise ProvisionError(f"the VM {name} disappeared while it was being created: someone (or something) in "
                                 f"project {project} deleted it", reason="failed") from None
        say(WAITING if status == "PENDING" else f"VM {status}", 0.0)
        if status == "RUNNING":
            return
        if status in ("TERMINATED", "STOPPED", "SUSPENDED") or time.monotonic() > deadline:
            raise ProvisionError(f"the VM {name} is {status}, not RUNNING", reason="failed")
        shared.pause(delay)
