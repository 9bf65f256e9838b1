"""The sandbox's Compute Engine API, driven by Google's own client (google-cloud-compute, REST):
TPU VM instances, workload policies, instance templates and BULK MIGs, the rules field reports
show (docs/cloud-facts.md, Compute Engine section), strict checks of every body, and each VM's
metadata, Python and JAX device count. ``insert_unary`` plus an operations client built with the
same options: ``.result()`` would poll the real endpoint (NOTES.md)."""
from __future__ import annotations

import importlib.metadata
import json
import os
import re
import urllib.error
import urllib.request

import pytest
from google.api_core import exceptions
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1
from google.protobuf import json_format

from tests.compute_schema_gen import SCHEMA, build, render
from tests.proto_check import repeated
from tests.conftest import wait_for
from tpunb.provision.gcp import apis
from tpunb import catalog
from tpunb.sandbox import AdminError
from tpunb.sandbox.box import start_sandbox
from tpunb.sandbox.server import Exchange

P, Z, R = "sandbox-project", "us-central1-c", "us-central1"  # a TPU7x zone (tpu-machines / regions-zones)
V6E_ZONE = "us-east5-b"


@pytest.fixture(scope="module")
def sandbox():
    box = start_sandbox(hosts=6, create_seconds=0.3, pythons=[])
    box.emulator.timings(delete_seconds=0.1, queue_seconds=0.1)
    box.exchanges = box.emulator.record_compute()
    yield box
    box.stop()


class Clients:
    """Every client a backend needs, on the sandbox's endpoint, and a wait for any operation."""

    def __init__(self, url: str) -> None:
        kw = {"credentials": AnonymousCredentials(), "client_options": ClientOptions(api_endpoint=url)}
        self.instances = compute_v1.InstancesClient(**kw)
        self.templates = compute_v1.RegionInstanceTemplatesClient(**kw)
        self.global_templates = compute_v1.InstanceTemplatesClient(**kw)
        self.policies = compute_v1.ResourcePoliciesClient(**kw)
        self.migs = compute_v1.InstanceGroupManagersClient(**kw)
        self.resize_requests = compute_v1.InstanceGroupManagerResizeRequestsClient(**kw)
        self.machine_types = compute_v1.MachineTypesClient(**kw)
        self.zone_ops = compute_v1.ZoneOperationsClient(**kw)
        self.region_ops = compute_v1.RegionOperationsClient(**kw)
        self.global_ops = compute_v1.GlobalOperationsClient(**kw)

    def wait(self, op: compute_v1.Operation) -> compute_v1.Operation:
        if op.zone:
            done = self.zone_ops.wait(project=P, zone=op.zone.rsplit("/", 1)[-1], operation=op.name)
        elif op.region:
            done = self.region_ops.wait(project=P, region=op.region.rsplit("/", 1)[-1], operation=op.name)
        else:
            done = self.global_ops.wait(project=P, operation=op.name)
        assert done.status == compute_v1.Operation.Status.DONE
        return done


@pytest.fixture(scope="module")
def ce(sandbox):
    return Clients(sandbox.compute_url)


def instance_body(name: str, machine: str, zone: str, **extra) -> compute_v1.Instance:
    """A TPU VM as docs/cloud-facts.md gives its body: image family, disk, gVNIC, TERMINATE, scopes."""
    shape_image = {"tpu7x": "ubuntu-accel-2404-amd64-tpu-tpu7x"}.get(apis.machine_type(machine).generation,
                                                                     "ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e")
    return compute_v1.Instance(
        name=name, machine_type=f"zones/{zone}/machineTypes/{machine}",
        disks=[compute_v1.AttachedDisk(boot=True, auto_delete=True, initialize_params=compute_v1.AttachedDiskInitializeParams(
            source_image=f"projects/ubuntu-os-accelerator-images/global/images/family/{shape_image}",
            disk_size_gb=200, disk_type=f"zones/{zone}/diskTypes/hyperdisk-balanced"))],
        network_interfaces=[compute_v1.NetworkInterface(network="global/networks/default", nic_type="GVNIC",
                                                        access_configs=[compute_v1.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")])],
        scheduling=compute_v1.Scheduling(on_host_maintenance="TERMINATE", **extra.pop("scheduling", {})),
        service_accounts=[compute_v1.ServiceAccount(email="default", scopes=["https://www.googleapis.com/auth/cloud-platform"])],
        labels={"tpunb-slice": name}, **extra)


def metadata(items: dict[str, str]) -> compute_v1.Metadata:
    return compute_v1.Metadata(items=[compute_v1.Items(key=k, value=v) for k, v in items.items()])


def make_slice(ce, name: str, topology: str = "2x2x4", size: int = 4, mode: str = "BULK", machine: str = "tpu7x-standard-4t",
               items: dict | None = None, zone: str = Z):
    """Workload policy -> regional template -> zonal MIG, as docs/cloud-facts.md orders them."""
    region = catalog.region_of(zone)
    ce.wait(ce.policies.insert_unary(project=P, region=region, resource_policy_resource=compute_v1.ResourcePolicy(
        name=f"{name}-wp", workload_policy=compute_v1.ResourcePolicyWorkloadPolicy(type_="HIGH_THROUGHPUT", accelerator_topology=topology))))
    ce.wait(ce.templates.insert_unary(project=P, region=region, instance_template_resource=compute_v1.InstanceTemplate(
        name=f"{name}-t", properties=compute_v1.InstanceProperties(machine_type=machine, metadata=metadata(items or {}),
                                                                   scheduling=compute_v1.Scheduling(on_host_maintenance="TERMINATE")))))
    return ce.migs.insert_unary(project=P, zone=zone, instance_group_manager_resource=compute_v1.InstanceGroupManager(
        name=name, base_instance_name=name, target_size=size,
        instance_template=f"projects/{P}/regions/{region}/instanceTemplates/{name}-t",
        target_size_policy=compute_v1.InstanceGroupManagerTargetSizePolicy(mode=mode),
        instance_lifecycle_policy=compute_v1.InstanceGroupManagerInstanceLifecyclePolicy(default_action_on_failure="DO_NOTHING"),
        resource_policies=compute_v1.InstanceGroupManagerResourcePolicies(workload_policy=f"projects/{P}/regions/{region}/resourcePolicies/{name}-wp")))


def slice_up(ce, name: str, zone: str = Z) -> bool:
    """The readiness test of docs/cloud-facts.md: stable, topology ACTIVE, every VM RUNNING with no action."""
    mig = ce.migs.get(project=P, zone=zone, instance_group_manager=name)
    vms = list(ce.migs.list_managed_instances(project=P, zone=zone, instance_group_manager=name))
    return (mig.status.is_stable and [t.state for t in mig.status.applied_accelerator_topologies] == ["ACTIVE"]
            and len(vms) == mig.target_size and all(v.instance_status == "RUNNING" and v.current_action == "NONE" for v in vms))


def delete_slice(ce, name: str, zone: str = Z) -> None:
    region = catalog.region_of(zone)
    ce.wait(ce.migs.delete_unary(project=P, zone=zone, instance_group_manager=name))
    ce.wait(ce.templates.delete_unary(project=P, region=region, instance_template=f"{name}-t"))
    ce.wait(ce.policies.delete_unary(project=P, region=region, resource_policy=f"{name}-wp"))


def metadata_value(sandbox, address: str, path: str) -> str:
    """What the VM at ``address`` reads from its metadata server."""
    request = urllib.request.Request(f"http://{address}:{sandbox.sshd.metadata_port}/computeMetadata/v1/{path}",
                                     headers={"Metadata-Flavor": "Google"})
    with urllib.request.urlopen(request, timeout=5) as answer:
        return answer.read().decode()


def attribute(sandbox, address: str, key: str) -> str:
    return metadata_value(sandbox, address, f"instance/attributes/{key}")


def raw(sandbox, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    """A call the client would never send (an unknown field, a bad int64), straight over HTTP."""
    request = urllib.request.Request(f"{sandbox.compute_url}/compute/v1/projects/{P}/{path}", method=method,
                                     data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.mark.sandbox
def test_the_sandbox_points_tpunb_at_its_compute_api_and_back(monkeypatch):
    monkeypatch.setenv("TPUNB_COMPUTE_API_ENDPOINT", "http://127.0.0.1:1")
    box = start_sandbox(hosts=1, pythons=[])
    try:
        assert os.environ["TPUNB_COMPUTE_API_ENDPOINT"] == box.compute_url == os.environ["TPUNB_TPU_API_ENDPOINT"]
        assert box.compute_url.startswith("http://127.0.0.1:")
    finally:
        box.stop()
    assert os.environ["TPUNB_COMPUTE_API_ENDPOINT"] == "http://127.0.0.1:1"


def test_a_single_v6e_instance_runs_and_goes(sandbox, ce):
    op = ce.instances.insert_unary(project=P, zone=V6E_ZONE, instance_resource=instance_body(
        "v6e-one", "ct6e-standard-8t", V6E_ZONE, metadata=metadata({"startup-script": "#!/bin/bash\ntrue\n"})))
    assert op.status != compute_v1.Operation.Status.DONE and op.operation_type == "insert"
    assert ce.wait(op).error.errors == []
    vm = ce.instances.get(project=P, zone=V6E_ZONE, instance="v6e-one")
    assert (vm.status, vm.machine_type.rsplit("/", 1)[-1]) == ("RUNNING", "ct6e-standard-8t")
    assert vm.network_interfaces[0].network_i_p in sandbox.sshd.addresses
    assert vm.scheduling.on_host_maintenance == "TERMINATE" and vm.labels["tpunb-slice"] == "v6e-one"
    assert [i.name for i in ce.instances.list(request={"project": P, "zone": V6E_ZONE, "filter": "labels.tpunb-slice:*"})] == ["v6e-one"]
    found = {zone: [i.name for i in scoped.instances] for zone, scoped in ce.instances.aggregated_list(
        request={"project": P, "filter": "labels.tpunb-slice = v6e-one"}) if scoped.instances}
    assert found == {f"zones/{V6E_ZONE}": ["v6e-one"]}
    address = vm.network_interfaces[0].network_i_p
    assert attribute(sandbox, address, "worker-id") == "0"
    assert "TOPOLOGY: '2x4'" in attribute(sandbox, address, "tpu-env")
    # setMetadata: only with the fingerprint just read (optimistic locking); the guest agent applies ssh-keys
    stale = compute_v1.Metadata(fingerprint="not-the-current-one", items=[compute_v1.Items(key="k", value="v")])
    with pytest.raises(exceptions.PreconditionFailed, match="fingerprint"):
        ce.instances.set_metadata_unary(project=P, zone=V6E_ZONE, instance="v6e-one", metadata_resource=stale)
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGx0 someone"
    fresh = compute_v1.Metadata(fingerprint=vm.metadata.fingerprint, items=[
        *vm.metadata.items, compute_v1.Items(key="ssh-keys", value=f"late:{key}")])
    assert ce.wait(ce.instances.set_metadata_unary(project=P, zone=V6E_ZONE, instance="v6e-one",
                                                   metadata_resource=fresh)).error.errors == []
    now = ce.instances.get(project=P, zone=V6E_ZONE, instance="v6e-one").metadata
    assert now.fingerprint != vm.metadata.fingerprint and {i.key: i.value for i in now.items}["ssh-keys"] == f"late:{key}"
    assert key in sandbox.sshd.logins(address)["late"]
    ce.wait(ce.instances.delete_unary(project=P, zone=V6E_ZONE, instance="v6e-one"))
    with pytest.raises(exceptions.NotFound, match="was not found"):
        ce.instances.get(project=P, zone=V6E_ZONE, instance="v6e-one")
    assert address not in sandbox.emulator.state()["hosts"]["allocated"]


def test_a_tpu7x_32_slice_is_a_bulk_mig_of_four_tpu7x_standard_4t(sandbox, ce):
    assert apis.compute_shape("tpu7x-32").vms == 4
    ce.wait(make_slice(ce, "t7", items={"enable-guest-attributes": "TRUE"}))
    wait_for(lambda: slice_up(ce, "t7"), 10, "the MIG stable, its topology ACTIVE, its VMs RUNNING")
    mig = ce.migs.get(project=P, zone=Z, instance_group_manager="t7")
    assert (mig.target_size, mig.target_size_policy.mode) == (4, "BULK")
    assert mig.resource_policies.workload_policy.endswith(f"projects/{P}/regions/{R}/resourcePolicies/t7-wp")
    assert mig.status.applied_accelerator_topologies[0].accelerator_topology == "2x2x4"
    names = [v.name for v in ce.migs.list_managed_instances(project=P, zone=Z, instance_group_manager="t7")]
    vms = [ce.instances.get(project=P, zone=Z, instance=n) for n in names]
    assert {v.machine_type.rsplit("/", 1)[-1] for v in vms} == {"tpu7x-standard-4t"}
    workers = {}
    for vm in vms:  # each VM's worker id from its own metadata, never the list's order
        address = vm.network_interfaces[0].network_i_p
        env = dict(re.findall(r"(\w+): '([^']*)'", attribute(sandbox, address, "tpu-env")))
        worker = attribute(sandbox, address, "worker-id")
        assert env["TPU_WORKER_ID"] == worker and env["TOPOLOGY"] == "2x2x4" and env["HOST_BOUNDS"] == "1,1,4"
        assert attribute(sandbox, address, "accelerator-type") == "v7x-32"
        workers[int(worker)] = vm.name
        with pytest.raises(urllib.error.HTTPError, match="404"):
            attribute(sandbox, address, "agent-worker-number")  # no report shows one on Compute Engine
    assert sorted(workers) == [0, 1, 2, 3]
    endpoints = attribute(sandbox, vms[0].network_interfaces[0].network_i_p, "worker-network-endpoints")
    assert endpoints == ",".join(workers[i] for i in range(4))  # bare names, worker order
    assert (ce.migs.list_errors(project=P, zone=Z, instance_group_manager="t7").items) == []
    survey = {  # what a survey after a Colab reset asks: every zone's and region's, by name
        "migs": {scope: [m.name for m in scoped.instance_group_managers] for scope, scoped in ce.migs.aggregated_list(
            request={"project": P, "filter": "name eq t7.*"})},
        "templates": {scope: [t.name for t in scoped.instance_templates] for scope, scoped in
                      ce.global_templates.aggregated_list(request={"project": P, "filter": "name eq t7-.*"})},
        "policies": {scope: [r.name for r in scoped.resource_policies] for scope, scoped in
                     ce.policies.aggregated_list(request={"project": P, "filter": "name ne nothing"})}}
    assert survey == {"migs": {f"zones/{Z}": ["t7"]}, "templates": {f"regions/{R}": ["t7-t"]},
                      "policies": {f"regions/{R}": ["t7-wp"]}}


def test_template_and_policy_in_use_cannot_go_then_go_in_order(sandbox, ce):
    if not ce.migs.list(project=P, zone=Z).items:
        ce.wait(make_slice(ce, "t7"))
    for call in (lambda: ce.templates.delete_unary(project=P, region=R, instance_template="t7-t"),
                 lambda: ce.policies.delete_unary(project=P, region=R, resource_policy="t7-wp")):
        with pytest.raises(exceptions.BadRequest, match=f"is already being used by 'projects/{P}/zones/{Z}/instanceGroupManagers/t7'") as caught:
            call()
        assert caught.value.errors[0]["reason"] == "resourceInUseByAnotherResource"
    delete_slice(ce, "t7")
    assert not list(ce.migs.list(project=P, zone=Z)) and not list(ce.templates.list(project=P, region=R))
    assert not list(ce.policies.list(project=P, region=R))
    assert not [i for i in sandbox.emulator.state()["compute"]["instances"] if i["zone"].endswith(Z)]


def test_the_flex_path_resizes_a_bulk_mig_and_refuses_resize_requests(sandbox, ce):
    ce.wait(make_slice(ce, "flex", size=0))
    assert ce.migs.get(project=P, zone=Z, instance_group_manager="flex").status.is_stable
    with pytest.raises(exceptions.BadRequest, match="Creating resize requests for managed instance group with TPU is not allowed"):
        ce.resize_requests.insert_unary(project=P, zone=Z, instance_group_manager="flex",
                                        instance_group_manager_resize_request_resource=compute_v1.InstanceGroupManagerResizeRequest(name="rr", resize_by=4))
    with pytest.raises(exceptions.BadRequest, match="2x2x4 takes 4 tpu7x-standard-4t VMs"):
        ce.migs.resize_unary(project=P, zone=Z, instance_group_manager="flex", size=3)
    ce.wait(ce.migs.resize_unary(project=P, zone=Z, instance_group_manager="flex", size=4))
    wait_for(lambda: slice_up(ce, "flex"), 10, "the resized MIG up")
    delete_slice(ce, "flex")


@pytest.mark.parametrize("mode, policy, message", [
    ("INDIVIDUAL", None, "MIGs with TPU accelerator topology require BULK mode in target size policy"),
    ("BULK", "flaw-wp", "The URL is malformed"),
])
def test_a_topology_mig_needs_bulk_and_a_policy_url(sandbox, ce, mode, policy, message):
    ce.wait(ce.policies.insert_unary(project=P, region=R, resource_policy_resource=compute_v1.ResourcePolicy(
        name="flaw-wp", workload_policy=compute_v1.ResourcePolicyWorkloadPolicy(type_="HIGH_THROUGHPUT", accelerator_topology="2x2x2"))))
    ce.wait(ce.templates.insert_unary(project=P, region=R, instance_template_resource=compute_v1.InstanceTemplate(
        name="flaw-t", properties=compute_v1.InstanceProperties(machine_type="tpu7x-standard-4t"))))
    try:
        with pytest.raises(exceptions.BadRequest, match=message):
            ce.migs.insert_unary(project=P, zone=Z, instance_group_manager_resource=compute_v1.InstanceGroupManager(
                name="flaw", base_instance_name="flaw", target_size=2, instance_template=f"projects/{P}/regions/{R}/instanceTemplates/flaw-t",
                target_size_policy=compute_v1.InstanceGroupManagerTargetSizePolicy(mode=mode),
                resource_policies=compute_v1.InstanceGroupManagerResourcePolicies(workload_policy=policy or f"projects/{P}/regions/{R}/resourcePolicies/flaw-wp")))
    finally:
        ce.wait(ce.templates.delete_unary(project=P, region=R, instance_template="flaw-t"))
        ce.wait(ce.policies.delete_unary(project=P, region=R, resource_policy="flaw-wp"))
    assert not list(ce.migs.list(project=P, zone=Z))


def test_a_topology_the_machine_type_cannot_make_is_refused(sandbox, ce):
    with pytest.raises(exceptions.BadRequest, match="accelerator topology 4x4 cannot be made of tpu7x-standard-4t VMs"):
        make_slice(ce, "odd", topology="4x4")
    delete_stored = [lambda: ce.templates.delete_unary(project=P, region=R, instance_template="odd-t"),
                     lambda: ce.policies.delete_unary(project=P, region=R, resource_policy="odd-wp")]
    for call in delete_stored:
        ce.wait(call())


def test_a_workload_policy_cannot_attach_to_an_instance(sandbox, ce):
    ce.wait(ce.policies.insert_unary(project=P, region=R, resource_policy_resource=compute_v1.ResourcePolicy(
        name="single-wp", workload_policy=compute_v1.ResourcePolicyWorkloadPolicy(type_="HIGH_THROUGHPUT", accelerator_topology="2x2x1"))))
    with pytest.raises(exceptions.BadRequest, match=r"Resource policy must have one of \[VmMaintenancePolicy, GroupPlacementPolicy, InstanceSchedulePolicy\]"):
        ce.instances.insert_unary(project=P, zone=Z, instance_resource=instance_body(
            "alone", "tpu7x-standard-4t", Z, resource_policies=[f"projects/{P}/regions/{R}/resourcePolicies/single-wp"]))
    ce.wait(ce.policies.delete_unary(project=P, region=R, resource_policy="single-wp"))


def test_a_zone_without_the_machine_type_names_the_zones_with_it(sandbox, ce):
    with pytest.raises(exceptions.BadRequest, match=r"Machine type with name 'tpu7x-standard-4t' does not exist in zone "
                       r"'us-east5-b'\. It is offered in us-central1-ai1a, us-central1-c"):
        ce.instances.insert_unary(project=P, zone="us-east5-b", instance_resource=instance_body("nowhere", "tpu7x-standard-4t", "us-east5-b"))
    zones = {zone for zone, scoped in ce.machine_types.aggregated_list(
        request={"project": P, "filter": "name = tpu7x-standard-4t"}) if scoped.machine_types}
    assert zones == {"zones/us-central1-ai1a", "zones/us-central1-c"}
    listed = {m.name: (m.guest_cpus, m.memory_mb) for m in ce.machine_types.list(project=P, zone=V6E_ZONE)}
    assert set(listed) == {"ct6e-standard-1t", "ct6e-standard-4t", "ct6e-standard-8t"} and listed["ct6e-standard-8t"][0] == 360
    assert ce.machine_types.get(project=P, zone="us-east5-a", machine_type="ct5p-hightpu-4t").guest_cpus == 208


def test_tpu7x_spot_and_flex_need_the_allowlist(sandbox, ce):
    for model in ("SPOT", "FLEX_START"):
        with pytest.raises(exceptions.Forbidden, match=f"{model} provisioning of tpu7x-standard-4t is restricted by an allowlist"):
            ce.instances.insert_unary(project=P, zone=Z, instance_resource=instance_body(
                "spot7", "tpu7x-standard-4t", Z, scheduling={"provisioning_model": model}))
    sandbox.emulator.compute_faults(allowlisted=True)
    try:
        ce.wait(ce.instances.insert_unary(project=P, zone=Z, instance_resource=instance_body(
            "spot7", "tpu7x-standard-4t", Z, scheduling={"provisioning_model": "SPOT", "instance_termination_action": "DELETE"})))
        ce.wait(ce.instances.delete_unary(project=P, zone=Z, instance="spot7"))
    finally:
        sandbox.emulator.compute_faults(allowlisted=False)


def test_a_quota_error_names_the_compute_engine_tpu_metric(sandbox, ce):
    sandbox.emulator.faults(quota="operation")
    try:
        done = ce.wait(ce.instances.insert_unary(project=P, zone=V6E_ZONE, instance_resource=instance_body("q", "ct6e-standard-4t", V6E_ZONE)))
        spot = ce.wait(ce.instances.insert_unary(project=P, zone=V6E_ZONE, instance_resource=instance_body(
            "q", "ct6e-standard-4t", V6E_ZONE, scheduling={"provisioning_model": "SPOT"})))
    finally:
        sandbox.emulator.clear_faults()
    assert [(e.code, e.message.split(" exceeded")[0]) for e in done.error.errors] == [
        ("QUOTA_EXCEEDED", "Quota 'TPUS-PER-TPU-FAMILY-per-project-region'")]
    assert "PREEMPTIBLE-TPU-V6E-per-project-region" in spot.error.errors[0].message
    with pytest.raises(exceptions.NotFound):
        ce.instances.get(project=P, zone=V6E_ZONE, instance="q")


def test_an_unstable_mig_shows_its_errors_and_a_recreated_vm_comes_back(sandbox, ce):
    sandbox.emulator.compute_faults(unstable=[Z], unstable_message="No capacity for the topology (synthetic)")
    try:
        ce.wait(make_slice(ce, "shaky", topology="2x2x2", size=2))
        errors = wait_for(lambda: list(ce.migs.list_errors(project=P, zone=Z, instance_group_manager="shaky")), 10, "listErrors")
        assert errors[0].error.message == "No capacity for the topology (synthetic)"
        mig = ce.migs.get(project=P, zone=Z, instance_group_manager="shaky")
        assert not mig.status.is_stable and mig.status.applied_accelerator_topologies[0].state == "ACTIVATING"
    finally:
        assert sandbox.emulator.compute_faults(unstable=False) == {"unstable_message": "No capacity for the topology (synthetic)"}
    with pytest.raises(AdminError, match="unknown Compute Engine fault 'unstabel'"):
        sandbox.emulator.compute_faults(unstabel=True)
    wait_for(lambda: slice_up(ce, "shaky"), 10, "the MIG up once the fault is gone")
    name = next(iter(ce.migs.list_managed_instances(project=P, zone=Z, instance_group_manager="shaky"))).name
    before = ce.instances.get(project=P, zone=Z, instance=name)
    sandbox.emulator.recreate(name)
    now = {v.name: v for v in ce.migs.list_managed_instances(project=P, zone=Z, instance_group_manager="shaky")}
    assert now[name].current_action == "RECREATING" and not ce.migs.get(project=P, zone=Z, instance_group_manager="shaky").status.is_stable
    wait_for(lambda: slice_up(ce, "shaky"), 10, "the recreated VM RUNNING")
    assert ce.instances.get(project=P, zone=Z, instance=name).id != before.id
    delete_slice(ce, "shaky")


def test_each_call_needs_its_compute_permission(sandbox, ce):
    user = sandbox.emulator.accounts()["user"]
    sandbox.emulator.accounts(permissions={user: ["compute.*.get", "compute.*.list"]})
    try:
        with pytest.raises(exceptions.Forbidden, match=f"Required 'compute.instances.create' permission for "
                           f"'projects/{P}/zones/{V6E_ZONE}/instances'"):
            ce.instances.insert_unary(project=P, zone=V6E_ZONE, instance_resource=instance_body("denied", "ct6e-standard-4t", V6E_ZONE))
        with pytest.raises(exceptions.Forbidden, match="compute.instanceGroupManagers.update"):
            ce.migs.resize_unary(project=P, zone=Z, instance_group_manager="any", size=1)
        assert sorted(m.name for m in ce.machine_types.list(project=P, zone="us-east5-a")) == [  # v5p's zone and v6e's
            "ct5p-hightpu-4t", "ct6e-standard-1t", "ct6e-standard-4t", "ct6e-standard-8t"]
    finally:
        sandbox.emulator.accounts(permissions={user: None})


def test_a_sandbox_without_the_images_python_says_so_and_keeps_its_hosts(sandbox, ce, monkeypatch):
    pythons = sandbox.emulator.emulator.hosts.vm_image["pythons"]
    monkeypatch.delitem(pythons, "3.12")
    with pytest.raises(exceptions.InternalServerError, match="no Python 3.12 for this machine type's image: pyenv install 3.12"):
        ce.instances.insert_unary(project=P, zone=Z, instance_resource=instance_body("nopy", "tpu7x-standard-4t", Z))
    ce.wait(make_slice(ce, "nopy", topology="2x2x2", size=2))
    errors = wait_for(lambda: list(ce.migs.list_errors(project=P, zone=Z, instance_group_manager="nopy")), 10, "listErrors")
    assert "pyenv install 3.12" in errors[0].error.message
    assert sandbox.emulator.state()["hosts"]["allocated"] == {}  # and the clock still runs:
    ce.wait(ce.instances.insert_unary(project=P, zone=V6E_ZONE, instance_resource=instance_body("withpy", "ct6e-standard-4t", V6E_ZONE)))
    ce.wait(ce.instances.delete_unary(project=P, zone=V6E_ZONE, instance="withpy"))
    delete_slice(ce, "nopy")


def test_a_spot_vm_gets_its_notice_then_is_terminated(sandbox, ce):
    ce.wait(ce.instances.insert_unary(project=P, zone=V6E_ZONE, instance_resource=instance_body(
        "spot6", "ct6e-standard-4t", V6E_ZONE, scheduling={"provisioning_model": "SPOT", "instance_termination_action": "STOP"})))
    address = ce.instances.get(project=P, zone=V6E_ZONE, instance="spot6").network_interfaces[0].network_i_p
    assert metadata_value(sandbox, address, "instance/preempted") == "FALSE"
    sandbox.preempt("spot6", notice=2)  # Compute Engine gives Spot VMs 30 s (tpu-machines)
    assert metadata_value(sandbox, address, "instance/preempted") == "TRUE"
    assert metadata_value(sandbox, address, "instance/maintenance-event") == "TERMINATE_ON_HOST_MAINTENANCE"
    assert ce.instances.get(project=P, zone=V6E_ZONE, instance="spot6").status == "RUNNING"  # within the notice
    wait_for(lambda: ce.instances.get(project=P, zone=V6E_ZONE, instance="spot6").status == "TERMINATED", 10, "TERMINATED")
    ce.wait(ce.instances.delete_unary(project=P, zone=V6E_ZONE, instance="spot6"))


#: a boot that says it is up (guest attribute tpunb/up), then runs until the guest's shutdown ends it;
#: with ``trap '' TERM`` it ignores the shutdown's SIGTERM (its sleep inherits that)
UP = """#!/bin/bash
{trap}
python3 -c 'import os, urllib.request; urllib.request.urlopen(urllib.request.Request("http://" + os.environ["GCE_METADATA_HOST"] + "/computeMetadata/v1/instance/guest-attributes/tpunb/up", data=b"1", method="PUT", headers={{"Metadata-Flavor": "Google"}}))'
sleep 600 & wait
"""


def test_a_spot_guest_that_halts_within_its_notice_is_terminated_then(sandbox, ce):
    """Compute Engine's soft-off gives a Spot VM's guest up to the window to stop (docs/cloud-facts.md):
    the VM whose last process ended on the shutdown's SIGTERM is TERMINATED then, long before its
    120 s window ends; the one whose process ignores SIGTERM is still RUNNING."""
    for name, trap in (("halts", ""), ("holds", "trap '' TERM")):
        items = {"startup-script": UP.format(trap=trap), "enable-guest-attributes": "TRUE"}
        ce.wait(ce.instances.insert_unary(project=P, zone=V6E_ZONE, instance_resource=instance_body(
            name, "ct6e-standard-4t", V6E_ZONE, metadata=metadata(items),
            scheduling={"provisioning_model": "SPOT", "instance_termination_action": "STOP"})))

    def up(name: str) -> bool:
        try:
            return ce.instances.get_guest_attributes(request={"project": P, "zone": V6E_ZONE, "instance": name,
                                                               "variable_key": "tpunb/up"}).variable_value == "1"
        except exceptions.NotFound:
            return False

    for name in ("halts", "holds"):
        wait_for(lambda name=name: up(name), 30, f"{name}'s boot up")
        sandbox.preempt(name, notice=120)
    status = {}
    wait_for(lambda: status.update({n: ce.instances.get(project=P, zone=V6E_ZONE, instance=n).status
                                    for n in ("halts", "holds")}) or status["halts"] == "TERMINATED", 30, "halts TERMINATED")
    assert status["holds"] == "RUNNING", status
    assert metadata_value(sandbox, ce.instances.get(project=P, zone=V6E_ZONE, instance="holds").network_interfaces[0]
                          .network_i_p, "instance/preempted") == "TRUE"  # it had the notice: its guest did not halt
    for name in ("halts", "holds"):
        ce.wait(ce.instances.delete_unary(project=P, zone=V6E_ZONE, instance=name))


def test_bodies_are_checked_against_compute_v1(sandbox, ce):
    with pytest.raises(exceptions.BadRequest, match=r"Invalid value at 'resource\.targetSizePolicy\.mode' \(TYPE_ENUM\), \"BULKK\""):
        make_slice(ce, "typo", mode="BULKK")
    for name in ("typo-t", "typo-wp"):
        stored = ce.templates if name.endswith("-t") else ce.policies
        ce.wait(stored.delete_unary(**{"project": P, "region": R, "instance_template" if name.endswith("-t") else "resource_policy": name}))
    status, answer = raw(sandbox, "POST", f"zones/{Z}/instances", {"name": "x", "machineType": "tpu7x-standard-4t", "gpus": 1})
    assert status == 400 and answer["error"]["errors"][0] == {
        "message": 'Invalid JSON payload received. Unknown name "gpus" at \'resource\': Cannot find field.',
        "domain": "global", "reason": "invalid"}
    assert answer["error"]["code"] == 400 and answer["error"]["message"] == answer["error"]["errors"][0]["message"]
    status, answer = raw(sandbox, "POST", f"zones/{Z}/instances", {"name": "x", "machineType": "tpu7x-standard-4t", "disks": [
        {"initializeParams": {"diskSizeGb": "two hundred"}}]})
    assert status == 400 and "resource.disks[0].initializeParams.diskSizeGb' (TYPE_INT64)" in answer["error"]["message"]
    status, answer = raw(sandbox, "POST", f"zones/{Z}/instances", {"name": "x", "scheduling": {"preemptible": "yes"}})
    assert status == 400 and "(TYPE_BOOL)" in answer["error"]["message"]
    status, answer = raw(sandbox, "GET", f"zones/{Z}/instances/missing")
    assert status == 404 and answer["error"]["errors"][0]["reason"] == "notFound"


def test_operations_are_waited_on_and_read(sandbox, ce):
    op = ce.global_templates.insert_unary(project=P, instance_template_resource=compute_v1.InstanceTemplate(
        name="global-t", properties=compute_v1.InstanceProperties(machine_type="ct6e-standard-4t")))
    assert not op.zone and not op.region
    assert ce.global_ops.get(project=P, operation=ce.wait(op).name).status == compute_v1.Operation.Status.DONE
    assert [t.name for t in ce.global_templates.list(project=P)] == ["global-t"]
    ce.wait(ce.global_templates.delete_unary(project=P, instance_template="global-t"))
    with pytest.raises(exceptions.NotFound):
        ce.zone_ops.get(project=P, zone=Z, operation="operation-0-missing")


PROBE = """#!/bin/bash
python3 - <<'EOF'
import json, os, socket, sys, urllib.request
base = "http://" + os.environ["GCE_METADATA_HOST"] + "/computeMetadata/v1/instance/"
def get(path):
    request = urllib.request.Request(base + path, headers={"Metadata-Flavor": "Google"})
    return urllib.request.urlopen(request).read().decode()
names = get("attributes/worker-network-endpoints").split(",")
probe = {"python": "%d.%d" % sys.version_info[:2], "xla": os.environ.get("XLA_FLAGS", ""),
         "resolved": {name: socket.gethostbyname(name) for name in names}}
urllib.request.urlopen(urllib.request.Request(base + "guest-attributes/tpunb/probe", data=json.dumps(probe).encode(),
                                              method="PUT", headers={"Metadata-Flavor": "Google"}))
EOF
"""


def test_each_vm_boots_its_machine_types_python_and_devices_and_resolves_its_peers(sandbox, ce, tmp_path):
    """The one test whose hosts run something: each VM's startup script (the boot runs it, as a
    VM's does) reports its Python, its JAX device count and its peers' addresses by bare name, as
    guest attributes; an SSH session on a TPU7x host sees the same image."""
    import paramiko

    from tpunb.sandbox.hosts.sshd import write_ed25519

    public = write_ed25519(tmp_path / "key")
    items = {"startup-script": PROBE, "enable-guest-attributes": "TRUE", "ssh-keys": f"root:{public}"}
    ce.wait(make_slice(ce, "boot7", topology="2x2x2", size=2, items=items))
    ce.wait(ce.instances.insert_unary(project=P, zone=V6E_ZONE, instance_resource=instance_body(
        "boot6", "ct6e-standard-4t", V6E_ZONE, metadata=metadata(items))))
    wait_for(lambda: slice_up(ce, "boot7"), 10, "the TPU7x slice up")
    names = [v.name for v in ce.migs.list_managed_instances(project=P, zone=Z, instance_group_manager="boot7")]

    def probe(zone: str, name: str) -> dict | None:
        try:
            answer = ce.instances.get_guest_attributes(request={"project": P, "zone": zone, "instance": name,
                                                                 "variable_key": "tpunb/probe"})
        except exceptions.NotFound:
            return None
        return json.loads(answer.variable_value)

    seen = {name: wait_for(lambda name=name: probe(Z, name), 30, f"{name}'s boot probe") for name in names}
    v6e = wait_for(lambda: probe(V6E_ZONE, "boot6"), 30, "the v6e VM's boot probe")
    addresses = {n: ce.instances.get(project=P, zone=Z, instance=n).network_interfaces[0].network_i_p for n in names}
    for name in names:
        assert seen[name]["python"] == "3.12" and seen[name]["xla"].endswith("device_count=8")  # TPU7x: 2 per chip
        assert seen[name]["resolved"] == addresses
    assert v6e["python"] == "3.10" and v6e["xla"].endswith("device_count=4")
    assert list(v6e["resolved"]) == ["boot6"]
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
    client.connect(addresses[names[0]], port=sandbox.sshd.port, username="root", key_filename=str(tmp_path / "key"),
                   look_for_keys=False, allow_agent=False, timeout=10)
    try:
        _, out, _ = client.exec_command("python3 -c 'import sys; print(sys.version_info[:2])'; echo $XLA_FLAGS; "
                                        f"getent hosts {names[1]}")
        text = out.read().decode()
    finally:
        client.close()
    assert "(3, 12)" in text and "device_count=8" in text and addresses[names[1]] in text
    profiles = [sandbox.sshd.host_environment(a)["BASH_ENV"] for a in addresses.values()]
    delete_slice(ce, "boot7")
    ce.wait(ce.instances.delete_unary(project=P, zone=V6E_ZONE, instance="boot6"))
    assert not any(os.path.exists(p) for p in profiles)  # the next VM on these hosts (a Cloud TPU node's) is the image as it was

def test_the_schema_file_is_what_google_cloud_compute_defines():
    """The file is written from tpunb's floor (1.48.0): every field, kind and enum value in it is the
    installed release's too (later releases add, and the few values they dropped are left out of the
    file: compute_schema_gen.DROPPED), so the sandbox refuses what the floor lacks."""
    written, installed = json.loads(SCHEMA.read_text()), build()
    for message, fields in written["messages"].items():
        assert fields.items() <= installed["messages"][message].items(), message
    for enum, values in written["enums"].items():
        assert set(values) <= set(installed["enums"][enum]), enum
    assert written["roots"] == installed["roots"]
    if importlib.metadata.version("google-cloud-compute") == "1.48.0":
        assert SCHEMA.read_text() == render(installed), "run: python tests/compute_schema_gen.py --write"


ANSWERS = [  # (method, path under projects/P/, the compute_v1 message of the answer)
    ("POST", r"(zones|regions)/[^/]+/\w+(/[^/]+/resize(Requests)?)?|global/instanceTemplates", compute_v1.Operation),
    ("DELETE", r".*", compute_v1.Operation),
    ("POST", r".*/operations/[^/]+/wait", compute_v1.Operation),
    ("POST", r"zones/[^/]+/instances/[^/]+/setMetadata", compute_v1.Operation),
    ("GET", r".*/operations/[^/]+", compute_v1.Operation),
    ("GET", r"zones/[^/]+/instances", compute_v1.InstanceList),
    ("GET", r"zones/[^/]+/instances/[^/]+", compute_v1.Instance),
    ("GET", r"aggregated/instances", compute_v1.InstanceAggregatedList),
    ("GET", r"(regions/[^/]+|global)/instanceTemplates", compute_v1.InstanceTemplateList),
    ("GET", r"regions/[^/]+/resourcePolicies", compute_v1.ResourcePolicyList),
    ("GET", r"zones/[^/]+/instanceGroupManagers", compute_v1.InstanceGroupManagerList),
    ("GET", r"zones/[^/]+/instanceGroupManagers/[^/]+", compute_v1.InstanceGroupManager),
    ("POST", r"zones/[^/]+/instanceGroupManagers/[^/]+/listManagedInstances", compute_v1.InstanceGroupManagersListManagedInstancesResponse),
    ("GET", r"zones/[^/]+/instanceGroupManagers/[^/]+/listErrors", compute_v1.InstanceGroupManagersListErrorsResponse),
    ("GET", r"zones/[^/]+/machineTypes", compute_v1.MachineTypeList),
    ("GET", r"zones/[^/]+/machineTypes/[^/]+", compute_v1.MachineType),
    ("GET", r"aggregated/machineTypes", compute_v1.MachineTypeAggregatedList),
    ("GET", r"aggregated/instanceGroupManagers", compute_v1.InstanceGroupManagerAggregatedList),
    ("GET", r"aggregated/instanceTemplates", compute_v1.InstanceTemplateAggregatedList),
    ("GET", r"aggregated/resourcePolicies", compute_v1.ResourcePolicyAggregatedList),
]


@pytest.fixture(autouse=True)
def answers_parse_strictly(sandbox):
    """After each test of this module, every call it made: its answer is the compute v1 message
    of that method, with no field Google's definition lacks; an error has Compute Engine's shape."""
    before = len(sandbox.exchanges)
    yield
    check_answers(sandbox.exchanges[before:])


def test_the_strict_check_refuses_what_google_would_not_send(sandbox):
    """The check above, on answers planted here: a field compute v1 lacks, an int64 as a JSON
    number (Google sends a string), an error without Compute Engine's shape."""
    path = "/compute/v1/projects/p/zones/z/instances/vm"
    good = {"kind": "compute#instance", "name": "vm", "id": "123"}
    check_answers([Exchange("GET", path, {}, b"", 200, json.dumps(good).encode())])
    for bad in ({**good, "noSuchField": 1}, {**good, "id": 123}):
        with pytest.raises((AssertionError, json_format.ParseError)):
            check_answers([Exchange("GET", path, {}, b"", 200, json.dumps(bad).encode())])
    with pytest.raises(AssertionError):
        check_answers([Exchange("GET", path, {}, b"", 404, json.dumps({"error": {"code": 404}}).encode())])


def check_answers(exchanges) -> None:
    for exchange in exchanges:
        rest = re.sub(r"^/compute/v1/projects/[^/]+/", "", exchange.path)
        answer = json.loads(exchange.response)
        if exchange.status != 200:
            assert set(answer["error"]) == {"code", "message", "errors"} and answer["error"]["code"] == exchange.status
            assert {"message", "domain", "reason"} == set(answer["error"]["errors"][0]), exchange
            continue
        message = next((m for method, pattern, m in reversed(ANSWERS)
                        if method == exchange.method and re.fullmatch(pattern, rest)), None)
        if message is None and rest.endswith("/getGuestAttributes"):
            message = compute_v1.GuestAttributes
        assert message is not None, f"no message for {exchange.method} {rest}"
        json_format.Parse(exchange.response, message.pb()(), ignore_unknown_fields=False)
        assert not list(int64_numbers(message.pb().DESCRIPTOR, answer, rest)), exchange


def int64_numbers(descriptor, value, where: str):
    """Where an answer gives an int64 or uint64 as a JSON number (Google's JSON gives it as a string)."""
    for field in descriptor.fields:
        if field.json_name not in value:
            continue
        item = value[field.json_name]
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            inner = field.message_type.fields_by_name["value"]
            items = list(item.values()) if inner.message_type is not None else []
            for each in items:
                yield from int64_numbers(inner.message_type, each, f"{where}.{field.json_name}")
        elif field.message_type is not None:
            for each in item if repeated(field) else [item]:
                yield from int64_numbers(field.message_type, each, f"{where}.{field.json_name}")
        elif field.type in (3, 4, 16, 18) and any(not isinstance(x, str) for x in (item if repeated(field) else [item])):
            yield f"{where}.{field.json_name}"
