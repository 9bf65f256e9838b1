"""What a Compute Engine launch asks for: the instance (or instance template) of a TPU VM, the
workload policy that names a multi-host slice's topology, and the BULK MIG that makes its VMs at
once; every body as docs/cloud-facts.md's Compute Engine section gives it, with its source.

Instances carry tpunb's labels (``created-by=tpunb``, ``tpunb-name``, ``tpunb-owner``, and the
launch's token ``tpunb-launch``): the survey finds them by label. MIGs, templates and policies have
no labels in the API, so each is named after the slice (``NAME``, ``NAME-tpunb-t``,
``NAME-tpunb-wp``) and carries ``MARKER``, the slice's name and the launch's token in its
description (common.py); a MIG also the time after which a survey may delete it while it waits."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from tpunb.provision.gcp import apis
from tpunb import catalog
from tpunb.provision.gcp.shared import LAUNCH_LABEL, Marker
from tpunb.provision.gcp.compute.network import network_path, subnetwork_path
from tpunb.provision.gcp.shared import (IAM_ENDPOINT, IDLE_ATTRIBUTE, NAME_LABEL, OWNER_LABEL, SLICE_METADATA, TPUNB_LABELS,
                                       label_value)

SCOPE = "https://www.googleapis.com/auth/cloud-platform"
PUBLIC_ENDPOINT = "https://compute.googleapis.com"


@dataclass(frozen=True)
class Names:
    """The resources of one slice: the MIG (or the single instance) is named after the slice."""

    slice: str

    @property
    def template(self) -> str:
        return f"{self.slice}-tpunb-t"

    @property
    def policy(self) -> str:
        return f"{self.slice}-tpunb-wp"

    def description(self, launch: str = "", deadline: float = 0.0) -> str:
        return Marker(self.slice, launch or None, deadline or None).text()


@dataclass(frozen=True)
class VmSpec:
    """What every VM of the slice gets, beside its machine type."""

    name: str
    shape: apis.ComputeShape
    zone: str
    owner: str
    user: str
    public_key: str
    os_login: bool
    spot: bool = False
    internal_ip: bool = False
    network: str | None = None
    subnetwork: str | None = None
    service_account: str | None = None
    labels: tuple[tuple[str, str], ...] = ()
    flex_hours: float | None = None  # FLEX_START: it runs at most this long, then is deleted
    flex_wait: int = 7200  # a single flex-start VM's requestValidForDuration (90-7200 s)
    reservation: str | None = None  # consume this specific reservation
    saved: str = ""  # JSON for the VMs' ``tpunb-slice`` metadata: what %tpu_use needs to rebuild the record
    project: str = ""
    idle_seconds: float = 0.0  # --idle-delete: worker 0's watchdog deletes the MIG (or instance) after this long idle
    idle_grace: float = 0.0  # at boot, the launching kernel has this long to say its launch is done
    launch: str = ""  # this launch's token (common.py): on every resource it makes
    deadline: float = 0.0  # a MIG's: after this (epoch seconds) no launch waits for it any more
    reservation_bound: bool = False  # RESERVATION_BOUND: the reservation came from a future reservation in calendar mode
    disk_size: int = 200  # the boot disk, GB


def idle_config(project: str, zone: str, name: str, seconds: float, multi_host: bool, launch: str = "") -> dict:
    """What the slice's watchdog (tpunb/host/standalone/idle.py) needs: its idle limit (0: grace-only),
    the APIs it calls with the VM's token, what it deletes (the MIG, its VMs with it, then its template
    and policy; or the instance) and the launch token that proves them this launch's."""
    from tpunb.provision.gcp.compute.clients import endpoint

    kind = "instanceGroupManagers" if multi_host else "instances"
    names, region, zonal = Names(name), catalog.region_of(zone), f"projects/{project}/zones/{zone}"
    node = f"{zonal}/{kind}/{name}"
    after = [f"projects/{project}/regions/{region}/instanceTemplates/{names.template}",
             f"projects/{project}/regions/{region}/resourcePolicies/{names.policy}"] if multi_host else []
    # Compute Engine names a delete's permission after the collection: compute.instanceGroupManagers.delete ...
    permissions = [f"compute.{path.split('/')[-2]}.delete" for path in [node, *after]]
    # a MIG's VMs are listed, then each asked (listManagedInstances is not in worker order); an instance is alone
    attributes = {"members": f"{node}/listManagedInstances",
                  "member": f"{zonal}/instances/{{name}}/getGuestAttributes?queryPath=tpunb%2F"} if multi_host else {}
    return {"seconds": seconds, "api": f"{(endpoint() or PUBLIC_ENDPOINT).rstrip('/')}/compute/v1",
            "iam_endpoint": endpoint() or IAM_ENDPOINT, "node": node, "delete": node, "after": after,
            "permissions": permissions, "attributes": attributes, **({} if multi_host else {"single_vm": True}),
            **({"launch": launch} if launch else {})}


def labels(spec: VmSpec) -> dict[str, str]:
    return {**dict(spec.labels), **TPUNB_LABELS, NAME_LABEL: label_value(spec.name),
            OWNER_LABEL: label_value(spec.owner or "unknown"), **({LAUNCH_LABEL: spec.launch} if spec.launch else {})}


def metadata(spec: VmSpec) -> Any:
    from google.cloud import compute_v1

    from tpunb.transport.bundle import idle_script

    # guest attributes: the VMs' host keys (hostkeys/), the other workers' services for the watchdog
    items = {"enable-guest-attributes": "TRUE"}
    if spec.saved:
        items[SLICE_METADATA] = spec.saved
    if not spec.os_login:  # under OS Login VMs ignore metadata keys
        items["ssh-keys"] = f"{spec.user}:{spec.public_key.strip()}"
    # worker 0 arms the watchdog at boot, before any kernel attaches; without --idle-delete grace-only:
    # a launch abandoned while its VMs came up (a kernel killed, a laptop asleep) does not bill for long
    config = idle_config(spec.project, spec.zone, spec.name, spec.idle_seconds, spec.shape.multi_host, spec.launch)
    items[IDLE_ATTRIBUTE] = json.dumps({**config, "grace": spec.idle_grace})
    items["startup-script"] = idle_script()
    return compute_v1.Metadata(items=[compute_v1.Items(key=k, value=v) for k, v in items.items()])


def _scheduling(spec: VmSpec) -> Any:
    from google.cloud import compute_v1

    if spec.flex_hours:  # capacity from the Dynamic Workload Scheduler, for at most maxRunDuration
        return compute_v1.Scheduling(on_host_maintenance="TERMINATE", provisioning_model="FLEX_START",
                                     instance_termination_action="DELETE", automatic_restart=False,
                                     max_run_duration=compute_v1.Duration(seconds=round(spec.flex_hours * 3600)))
    if spec.reservation_bound:  # a calendar-mode reservation's VMs: bound to it, deleted at its end
        return compute_v1.Scheduling(on_host_maintenance="TERMINATE", provisioning_model="RESERVATION_BOUND",
                                     instance_termination_action="DELETE", automatic_restart=False)
    if spec.spot:  # Google's spot TPU VMs: SPOT, deleted (not stopped) when reclaimed
        return compute_v1.Scheduling(on_host_maintenance="TERMINATE", provisioning_model="SPOT",
                                     instance_termination_action="DELETE", automatic_restart=False)
    return compute_v1.Scheduling(on_host_maintenance="TERMINATE", automatic_restart=True)


def _nic(spec: VmSpec) -> Any:
    from google.cloud import compute_v1

    nic = compute_v1.NetworkInterface(network=network_path(spec.network), nic_type="GVNIC")
    if spec.subnetwork:
        nic.subnetwork = subnetwork_path(spec.subnetwork, catalog.region_of(spec.zone))
    if not spec.internal_ip:
        nic.access_configs = [compute_v1.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")]
    return nic


def _disk(spec: VmSpec, disk_type: str) -> Any:
    from google.cloud import compute_v1

    return compute_v1.AttachedDisk(boot=True, auto_delete=True, initialize_params=compute_v1.AttachedDiskInitializeParams(
        source_image=spec.shape.source_image, disk_size_gb=spec.disk_size, disk_type=disk_type))


def _account(spec: VmSpec) -> Any:
    from google.cloud import compute_v1

    return compute_v1.ServiceAccount(email=spec.service_account or "default", scopes=[SCOPE])


def _affinity(spec: VmSpec) -> Any:
    """A named reservation (gcloud's --reservation: the reservation-name key), none for flex-start."""
    from google.cloud import compute_v1

    if spec.reservation:
        return compute_v1.ReservationAffinity(consume_reservation_type="SPECIFIC_RESERVATION",
                                              key="compute.googleapis.com/reservation-name", values=[spec.reservation])
    if spec.flex_hours:
        return compute_v1.ReservationAffinity(consume_reservation_type="NO_RESERVATION")
    return None


def instance(spec: VmSpec) -> Any:
    """A single-host slice: one instance of the TPU machine type (a flex-start one waits for
    capacity up to its requestValidForDuration)."""
    from google.cloud import compute_v1

    zone = spec.zone
    made = compute_v1.Instance(
        name=spec.name, machine_type=f"zones/{zone}/machineTypes/{spec.shape.machine_type}",
        disks=[_disk(spec, f"zones/{zone}/diskTypes/{spec.shape.disk_type}")], network_interfaces=[_nic(spec)],
        scheduling=_scheduling(spec), service_accounts=[_account(spec)], labels=labels(spec), metadata=metadata(spec),
        description=Names(spec.name).description(spec.launch))
    if spec.flex_hours:
        made.params = compute_v1.InstanceParams(request_valid_for_duration=compute_v1.Duration(seconds=spec.flex_wait))
    if _affinity(spec) is not None:
        made.reservation_affinity = _affinity(spec)
    return made


def template(spec: VmSpec) -> Any:
    """The instance template a multi-host slice's MIG makes its VMs from (regional, in the zone's region)."""
    from google.cloud import compute_v1

    return compute_v1.InstanceTemplate(
        name=Names(spec.name).template, description=Names(spec.name).description(spec.launch),
        properties=compute_v1.InstanceProperties(
            machine_type=spec.shape.machine_type, disks=[_disk(spec, spec.shape.disk_type)],
            network_interfaces=[_nic(spec)], scheduling=_scheduling(spec), service_accounts=[_account(spec)],
            labels=labels(spec), metadata=metadata(spec),
            **({"reservation_affinity": _affinity(spec)} if _affinity(spec) is not None else {})))


def workload_policy(spec: VmSpec) -> Any:
    """HIGH_THROUGHPUT with the slice's accelerator topology: what makes a MIG's VMs one TPU slice."""
    from google.cloud import compute_v1

    return compute_v1.ResourcePolicy(
        name=Names(spec.name).policy, description=Names(spec.name).description(spec.launch),
        workload_policy=compute_v1.ResourcePolicyWorkloadPolicy(type_="HIGH_THROUGHPUT",
                                                                accelerator_topology=spec.shape.topology))


def mig(spec: VmSpec, project: str) -> Any:
    """A zonal MIG of the slice's VMs, all made at once (BULK), left as they are on failure
    (DO_NOTHING: tpunb deletes the slice rather than have a VM recreated under JAX). Flex-start:
    made empty and resized to the slice (resize requests are refused for TPU MIGs)."""
    from google.cloud import compute_v1

    names, region = Names(spec.name), catalog.region_of(spec.zone)
    return compute_v1.InstanceGroupManager(
        name=spec.name, base_instance_name=spec.name, target_size=0 if spec.flex_hours else spec.shape.vms,
        description=names.description(spec.launch, spec.deadline),
        instance_template=f"projects/{project}/regions/{region}/instanceTemplates/{names.template}",
        target_size_policy=compute_v1.InstanceGroupManagerTargetSizePolicy(mode="BULK"),
        instance_lifecycle_policy=compute_v1.InstanceGroupManagerInstanceLifecyclePolicy(
            default_action_on_failure="DO_NOTHING"),
        resource_policies=compute_v1.InstanceGroupManagerResourcePolicies(
            workload_policy=f"projects/{project}/regions/{region}/resourcePolicies/{names.policy}"))
