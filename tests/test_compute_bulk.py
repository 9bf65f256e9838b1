"""A BULK MIG fails fast and says why. The sandbox behaves as Compute Engine's bulk mode does: a MIG
that waits lists every VM it will make (a name and a URL, no status, no id; flex-start ones
PENDING) and says why it waits in status.bulkInstanceOperation and its members' lastAttempt, with
a quota named in quotaInfo. tpunb reads those on every look: what waiting will not change (a
refusal that is not for capacity, INTERNAL_ERROR outside flex-start, a FAILED topology) ends the
launch at once, a capacity refusal waits for --timeout where no zone is left to try (flex-start
counts INTERNAL_ERROR as one), and once every VM exists the slice's activation has a limit of its
own. The backend is driven up to its hosts; one-line errors come from real cells."""
from __future__ import annotations

import dataclasses
import time

import pytest

from tests.compute_fixture import Google, cloud, made, sandbox  # noqa: F401 - cloud is a fixture
from tests.conftest import wait_for
from tpunb.provision.gcp import apis
from tpunb import catalog
from tpunb.errors import ProvisionError
from tpunb.provision.gcp.shared import new_launch
from tpunb.provision.gcp.compute import VmSpec, bodies, bulk, first_granted, teardown
from tpunb.provision.gcp.config import CloudOptions
from tpunb.registry import Registry, SliceRecord

pytestmark = pytest.mark.sandbox

TPU7X_ZONE, V5P_ZONE = "us-central1-c", "us-east5-a"


@pytest.fixture(scope="module")
def box():
    yield from sandbox(2, 0.1, 0.05, 0.05)


def up_to_hosts(box, isolated_home, name: str, accelerator: str, zone: str, on_state=None, **options):
    """The backend's launch in one zone up to its hosts: (hosts, what it said)."""
    vm = VmSpec(name, apis.compute_shape(accelerator), zone, "someone@example.com", "tpunb",
                "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGx0 someone", False, flex_hours=options.get("flex"),
                launch=new_launch())
    record = SliceRecord(name=name, accelerator=accelerator, backend="gcp", state="creating",
                         spec={"api": "compute", "project": box.project, "zone": zone, "launch": vm.launch})
    said: list[str] = []

    def say(text: str, _: float) -> None:
        said.append(text)
        if on_state:
            on_state(text)

    hosts, _ = first_granted(box.project, vm, [zone], record, Registry(isolated_home / "registry.db"), say,
                             CloudOptions(**options))
    return hosts, said


def nothing_in(google: Google, zone: str) -> bool:
    return all(not v for v in google.everything(zone).values())


def test_a_waiting_bulk_mig_lists_its_vms_before_they_exist_and_says_why_it_waits(cloud):
    google, p = Google(cloud), cloud.project
    cloud.emulator.faults(quota="operation", quota_regions=["us-central1"])
    made(google, "held", "tpu7x-16", TPU7X_ZONE)
    group = wait_for(lambda: (lambda g: g if g.status.bulk_instance_operation.last_progress_check.error.errors
                              else None)(google.migs.get(project=p, zone=TPU7X_ZONE, instance_group_manager="held")),
                     10, "the MIG's first try")
    members = list(google.migs.list_managed_instances(project=p, zone=TPU7X_ZONE, instance_group_manager="held"))
    assert len(members) == 2 and all(m.name.startswith("held-") and m.instance.endswith(f"/instances/{m.name}")
                                     for m in members)
    assert all((m.instance_status, m.id, m.current_action) == ("", 0, "CREATING") for m in members)
    assert all(m.last_attempt.errors.errors[0].code == "QUOTA_EXCEEDED" for m in members)
    bulk_status = group.status.bulk_instance_operation
    quota = bulk_status.last_progress_check.error.errors[0].error_details[0].quota_info
    assert bulk_status.in_progress and group.status.current_instance_statuses.non_existent == 2
    assert (quota.limit_name, dict(quota.dimensions), quota.limit) == (
        "TPUS-PER-TPU-FAMILY-per-project-region", {"region": "us-central1"}, 0)
    assert [t.state for t in group.status.applied_accelerator_topologies] == ["ACTIVATING"]
    cloud.emulator.faults(quota=None)  # the quota comes: the VMs it listed are made, under those names
    wait_for(lambda: google.migs.get(project=p, zone=TPU7X_ZONE, instance_group_manager="held").status.is_stable,
             10, "the MIG to be stable")
    now = list(google.migs.list_managed_instances(project=p, zone=TPU7X_ZONE, instance_group_manager="held"))
    assert sorted(m.name for m in now) == sorted(m.name for m in members) and all(m.id for m in now)
    assert teardown(p, TPU7X_ZONE, "held") == ""

    cloud.emulator.faults(no_capacity=[V5P_ZONE])  # flex-start: made empty, resized, its members PENDING
    vm = dataclasses.replace(VmSpec("flexed", apis.compute_shape("v5p-16"), V5P_ZONE, "someone@example.com", "tpunb",
                                    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGx0 someone", False), flex_hours=1.0)
    region = catalog.region_of(V5P_ZONE)
    google.policies.insert_unary(project=p, region=region, resource_policy_resource=bodies.workload_policy(vm))
    google.templates.insert_unary(project=p, region=region, instance_template_resource=bodies.template(vm))
    google.migs.insert_unary(project=p, zone=V5P_ZONE, instance_group_manager_resource=bodies.mig(vm, p))
    google.migs.resize_unary(project=p, zone=V5P_ZONE, instance_group_manager="flexed", size=2)
    pending = wait_for(lambda: (lambda ms: ms if len(ms) == 2 else None)(list(google.migs.list_managed_instances(
        project=p, zone=V5P_ZONE, instance_group_manager="flexed"))), 10, "the flex-start members")
    assert [(m.instance_status, m.id) for m in pending] == [("PENDING", 0)] * 2
    assert teardown(p, V5P_ZONE, "flexed") == "" and nothing_in(google, V5P_ZONE)


@pytest.mark.fresh_slice
def test_a_capacity_refusal_waits_for_timeout_where_no_zone_is_left(cloud, cell):
    cloud.emulator.faults(no_capacity=[TPU7X_ZONE])
    run = cell(f"%tpu_launch tpu7x-16 --zone {TPU7X_ZONE} --name dry --timeout 1")
    assert str(run.error).startswith("no capacity came for the MIG dry before --timeout: The zone "), str(run.error)
    assert "(ZONE_RESOURCE_POOL_EXHAUSTED)" in str(run.error) and "\n" not in str(run.error)
    assert "Traceback" not in run.shown and nothing_in(Google(cloud), TPU7X_ZONE)


@pytest.mark.parametrize("faults, message", [
    ({"unstable": [TPU7X_ZONE], "unstable_code": "CONDITION_NOT_MET", "unstable_message": "Org policy forbids it"},
     "the MIG stop cannot make its 2 VMs: Org policy forbids it (CONDITION_NOT_MET)"),
    ({"unstable": [TPU7X_ZONE], "unstable_code": "INTERNAL_ERROR", "unstable_message": "Internal error"},
     "the MIG stop cannot make its 2 VMs: Internal error (INTERNAL_ERROR)"),
    ({"topology_failed": [TPU7X_ZONE], "topology_code": "TOPOLOGY_FAILED", "topology_message": "ICI links down"},
     "the MIG stop's accelerator topology is FAILED: ICI links down (TOPOLOGY_FAILED)"),
], ids=["org-policy", "internal-error", "topology-failed"])
@pytest.mark.fresh_slice
def test_what_waiting_will_not_change_ends_the_launch_at_once(cloud, cell, faults, message):
    cloud.emulator.compute_faults(**faults)
    started = time.monotonic()
    try:
        run = cell(f"%tpu_launch tpu7x-16 --zone {TPU7X_ZONE} --name stop")  # no --timeout: 20 minutes it would wait
    finally:
        cloud.emulator.compute_faults(**{k: False for k in faults})
    assert str(run.error) == message and time.monotonic() - started < 30, (str(run.error), run.shown)
    assert "Traceback" not in run.shown and nothing_in(Google(cloud), TPU7X_ZONE)


def test_under_flex_start_internal_error_is_waited_out_as_no_capacity(cloud, isolated_home):
    cloud.emulator.compute_faults(unstable=[V5P_ZONE], unstable_code="INTERNAL_ERROR")
    lift = lambda text: text.startswith(bulk.WAITING) and cloud.emulator.compute_faults(unstable=False)  # noqa: E731
    hosts, said = up_to_hosts(cloud, isolated_home, "patient", "v5p-16", V5P_ZONE, lift, flex=1.0)
    assert len(hosts) == 2 and f"{bulk.WAITING}: 0/2 VMs" in said, said
    assert teardown(cloud.project, V5P_ZONE, "patient") == ""


def test_activation_has_a_limit_of_its_own_that_grows_with_the_vms(cloud, isolated_home, monkeypatch):
    cloud.emulator.compute_faults(activation_seconds=1.5)  # every VM runs, the topology still ACTIVATING
    try:
        hosts, said = up_to_hosts(cloud, isolated_home, "slow", "tpu7x-16", TPU7X_ZONE, timeout=0.2)
        assert len(hosts) == 2 and "2/2 VMs running, topology ACTIVATING" in said, said  # past --timeout: fine
        assert teardown(cloud.project, TPU7X_ZONE, "slow") == ""
        monkeypatch.setattr(bulk, "ACTIVATION_BASE", 1.0)
        monkeypatch.setattr(bulk, "ACTIVATION_PER_VM", 0.0)
        cloud.emulator.compute_faults(activation_seconds=60)
        with pytest.raises(ProvisionError) as stuck:
            up_to_hosts(cloud, isolated_home, "stuck", "tpu7x-16", TPU7X_ZONE)
    finally:
        cloud.emulator.compute_faults(activation_seconds=False)
    assert str(stuck.value) == ("the MIG stuck made its 2 VMs but was not ready within 1s (2 running, topology "
                                "ACTIVATING)"), str(stuck.value)
    assert nothing_in(Google(cloud), TPU7X_ZONE)
