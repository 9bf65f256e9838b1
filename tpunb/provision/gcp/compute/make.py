"""Making one slice's Compute Engine resources in one zone, in order, each waited for (the
workload policy, the instance template and the BULK MIG; or the instance), then waiting until
the slice is up: a MIG stable with its topology ACTIVE and every VM RUNNING with no current
action (docs/cloud-facts.md), a VM RUNNING. Flex-start waits for capacity: a PENDING VM, or an
empty MIG sized up. Whatever stops it part way, the caller deletes what exists (delete.py)."""
from __future__ import annotations

import time

from tpunb import catalog
from tpunb.errors import ProvisionError
from tpunb.provision.gcp import api
from tpunb.provision.gcp.compute import clients
from tpunb.provision.gcp.compute.bodies import VmSpec, instance, mig, template, workload_policy

#: what a flex-start wait is called on the launch line (and what an interrupt there says it cut short)
WAITING = "waiting for capacity (flex-start)"


def make_resources(project: str, vm: VmSpec, say, deadline: float) -> None:
    """The resources, in order, each waited for; then until the slice is up (whatever stops it part
    way, ``teardown`` deletes what exists)."""
    c, region = clients.clients(), catalog.region_of(vm.zone)

    def create(what: str, insert, **where) -> None:
        say(f"creating its {what}", 0.0)
        clients.wait(project, clients.call(f"create the {what}", insert, project=project, **where), f"create the {what}",
                     deadline)

    if vm.shape.multi_host:
        create("workload policy", c.policies.insert_unary, region=region, resource_policy_resource=workload_policy(vm))
        create("instance template", c.templates.insert_unary, region=region, instance_template_resource=template(vm))
        create(f"MIG of {vm.shape.vms} VMs", c.migs.insert_unary, zone=vm.zone,
               instance_group_manager_resource=mig(vm, project))
        if vm.flex_hours:  # made empty: sized up, it waits for capacity for all its VMs at once (BULK)
            create("flex-start request (the MIG resized)", c.migs.resize_unary, zone=vm.zone,
                   instance_group_manager=vm.name, size=vm.shape.vms)
        _wait_up(project, vm.zone, vm.name, say, deadline, bool(vm.flex_hours))
    elif vm.flex_hours:  # its insert may stay RUNNING until capacity comes (up to 2 h): followed by the VM's status
        say("creating its VM", 0.0)
        op = clients.call("create the VM", c.instances.insert_unary, project=project, zone=vm.zone,
                          instance_resource=instance(vm))
        _wait_running(project, vm.zone, vm.name, say, deadline, op)
    else:
        create("VM", c.instances.insert_unary, zone=vm.zone, instance_resource=instance(vm))
        _wait_running(project, vm.zone, vm.name, say, deadline)


def _wait_running(project: str, zone: str, name: str, say, deadline: float, flex_op=None) -> None:
    """Until the VM is RUNNING. A flex-start VM (``flex_op``: its insert, read without waiting on
    it) is PENDING while it waits for capacity, and gone once its requestValidForDuration passes
    without any (without an error, field reports say) or its provisioning failed (its insert's
    error says why); an on-demand VM that disappears was deleted while it was being made."""
    from google.api_core import exceptions
    from google.cloud import compute_v1

    c = clients.clients()
    for delay in api.poll_delays():
        done = flex_op is not None and flex_op.status == compute_v1.Operation.Status.DONE
        if flex_op is not None and not done:
            flex_op = clients.call("read the VM's insert", c.zone_ops.get, project=project, zone=zone,
                                   operation=flex_op.name)
            done = flex_op.status == compute_v1.Operation.Status.DONE
        if done:
            clients.wait(project, flex_op, "create the VM")  # done: its error, if any, as one line
        try:
            status = clients.call("read the VM", c.instances.get, project=project, zone=zone, instance=name).status
        except exceptions.NotFound:
            if flex_op is not None and not done and time.monotonic() < deadline:
                api.pause(delay)  # accepted, not listed yet
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
        api.pause(delay)



def _wait_up(project: str, zone: str, name: str, say, deadline: float, flex: bool = False) -> None:
    """Until the MIG is stable, its topology ACTIVE and every VM RUNNING with no current action.
    While its VMs are not all made, its listErrors are read: a stockout or quota there ends the
    wait at once (BULK would wait for all of them: another zone may have them now), unless the
    slice is flex-start, whose point is to wait; past the deadline, one line with what listErrors
    say."""
    c = clients.clients()
    for delay in api.poll_delays():
        group = clients.call("read the MIG", c.migs.get, project=project, zone=zone, instance_group_manager=name)
        vms = list(clients.call("list the MIG's VMs", c.migs.list_managed_instances, project=project, zone=zone,
                                instance_group_manager=name))
        topology = [t.state for t in group.status.applied_accelerator_topologies]
        running = sum(v.instance_status == "RUNNING" and v.current_action == "NONE" for v in vms)
        say(f"{WAITING}: 0/{group.target_size} VMs" if flex and not vms else
            f"{running}/{group.target_size} VMs running, topology {'/'.join(topology) or 'pending'}", 0.0)
        if group.status.is_stable and topology == ["ACTIVE"] and running == group.target_size == len(vms):
            return
        errors = mig_errors(project, zone, name) if len(vms) < group.target_size or time.monotonic() > deadline else []
        refusal = next((clients.reason_of(code) for code, _ in errors if clients.reason_of(code) != "api"
                        and not (flex and clients.reason_of(code) == "no_capacity")), None)
        if refusal or time.monotonic() > deadline:
            why = "; ".join(dict.fromkeys(message for _, message in errors[-3:])) or "no errors listed"
            what = {"no_capacity": "has no capacity for", "quota": "is over quota for"}.get(refusal or "")
            raise ProvisionError(f"the MIG {name} {what} its {group.target_size} VMs: {why}"
                                 f"{clients.more(refusal or '', project)}" if what else
                                 f"no capacity came for the MIG {name} before --timeout: {why}" if flex and not vms else
                                 f"the MIG {name} did not become stable in time: {why}", reason=refusal or "timeout")
        api.pause(delay)


def mig_errors(project: str, zone: str, name: str) -> list[tuple[str, str]]:
    """The MIG's listErrors, oldest first: (code, message) of each."""
    c = clients.clients()
    listed = clients.call("read the MIG's errors", c.migs.list_errors, project=project, zone=zone,
                          instance_group_manager=name)
    return [(e.error.code, e.error.message) for e in listed if e.error]
