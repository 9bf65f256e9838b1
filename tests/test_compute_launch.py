"""TPUs through Compute Engine, end to end: %tpu_launch of a TPU7x slice with no --api makes a
workload policy, an instance template and a BULK MIG on the sandbox's Compute Engine API (Google's
own google-cloud-compute client looks at them), its hosts are bare images with their machine
type's Python and device count, numbered by the worker id in each VM's metadata; a cell sees the
whole slice; %tpu_down leaves nothing. A single-host v6e is one instance."""
from __future__ import annotations

import re

import pytest

from tests.compute_fixture import Google, cloud, sandbox  # noqa: F401 - cloud is a fixture
from tpunb import catalog
from tpunb.status import readable

TPU7X_ZONE, V6E_ZONE = "us-central1-c", "us-east5-b"


@pytest.fixture(scope="module")
def box():
    yield from sandbox(5, 0.3, 0.1, 0.1)


def test_a_tpu7x_32_is_a_bulk_mig_whose_cell_sees_32_devices_and_goes_whole(cloud, cell, ip):
    google = Google(cloud)
    run = cell(f"%tpu_launch tpu7x-32 --name iron --zone {TPU7X_ZONE}")
    assert run.error is None, run.shown
    assert "through Compute Engine" in run.stdout and "4 x tpu7x-standard-4t" in run.stdout, run.stdout
    group = google.migs.get(project=cloud.project, zone=TPU7X_ZONE, instance_group_manager="iron")
    assert group.target_size == 4 and group.target_size_policy.mode == "BULK"
    assert group.instance_lifecycle_policy.default_action_on_failure == "DO_NOTHING"
    policy = google.policies.get(project=cloud.project, region=catalog.region_of(TPU7X_ZONE),
                                 resource_policy=group.resource_policies.workload_policy.rsplit("/", 1)[-1])
    assert (policy.workload_policy.type_, policy.workload_policy.accelerator_topology) == ("HIGH_THROUGHPUT", "2x2x4")
    vms = [google.instances.get(project=cloud.project, zone=TPU7X_ZONE, instance=v.instance.rsplit("/", 1)[-1])
           for v in google.migs.list_managed_instances(project=cloud.project, zone=TPU7X_ZONE,
                                                       instance_group_manager="iron")]
    assert sorted(v.machine_type.rsplit("/", 1)[-1] for v in vms) == ["tpu7x-standard-4t"] * 4
    assert all(v.labels["created-by"] == "tpunb" for v in vms)

    cell("%tpu_status")
    shown = readable(ip.user_ns["_"])
    assert list(shown["usd_per_hour"]) == ["price unknown"] * 4  # Google publishes no TPU7x price: never $0
    assert list(shown["cloud_state"]) == ["READY"] * 4
    jax = cell("%%on_tpu\nimport os, jax\nprint(jax.device_count(), jax.local_device_count())\n"
               "jax.process_index() == int(os.environ['TPUNB_HOST_INDEX'])")
    assert jax.error is None, jax.shown
    assert "[0-3] 32 8" in jax.stdout and "Out[0-3]: True" in jax.shown, jax.shown
    ids = cell("%%on_tpu\nimport json, os, urllib.request\nurllib.request.urlopen(urllib.request.Request("
               "f\"http://{os.environ['GCE_METADATA_HOST']}/computeMetadata/v1/instance/attributes/worker-id\", "
               "headers={'Metadata-Flavor': 'Google'})).read().decode()")
    assert all(re.search(fr"Out\[{i}\]: '{i}'", ids.shown) for i in range(4)), ids.shown  # host i is worker i

    down = cell("%tpu_down iron")
    assert down.error is None, down.shown
    assert google.everything(TPU7X_ZONE) == {"instances": [], "migs": [], "templates": [], "policies": []}


def test_a_single_host_v6e_is_one_instance_and_runs_a_cell(cloud, cell):
    google = Google(cloud)
    run = cell(f"%tpu_launch v6e-8 --name trillium --zone {V6E_ZONE}")
    assert run.error is None, run.shown
    vm = google.instances.get(project=cloud.project, zone=V6E_ZONE, instance="trillium")
    assert vm.machine_type.rsplit("/", 1)[-1] == "ct6e-standard-8t" and vm.scheduling.on_host_maintenance == "TERMINATE"
    out = cell("%%on_tpu\nimport jax\njax.device_count()")
    assert out.error is None and out.shown.strip() == "8", out.shown  # one host: its value, unlabelled
    assert cell("%tpu_down trillium").error is None
    assert google.everything(V6E_ZONE)["instances"] == []


@pytest.mark.parametrize("line, message", [
    (f"v4-8 --api compute --zone {TPU7X_ZONE}", r"^v4-8 is made only through the Cloud TPU API"),
    (f"tpu7x-32 --api tpu --zone {TPU7X_ZONE}", r"^tpu7x-32 is made only through Compute Engine .*: launch it without --api tpu$"),
    (f"tpu7x-32 --queued --zone {TPU7X_ZONE}", r"^--queued \(queued resources\) is for the Cloud TPU API: add --api tpu"),
    (f"tpu7x-32 --zone {V6E_ZONE}", fr"^{V6E_ZONE} has no tpu7x-standard-4t \(tpu7x-32\): zones with it: "),
    ("v6e-8 --api cloud", r"^--api cloud: give tpu \(the Cloud TPU API\) or compute \(Compute Engine\)$"),
])
def test_what_compute_engine_cannot_do_is_one_line_and_makes_nothing(cloud, cell, line, message):
    run = cell(f"%tpu_launch {line}")
    assert run.error is not None and re.search(message, str(run.error)), (str(run.error), run.shown)
    assert "Traceback" not in run.shown
    assert all(not v for v in Google(cloud).everything(TPU7X_ZONE).values())


def test_doctor_asks_compute_engine_for_a_type_it_makes(cloud):
    from tpunb.doctor import doctor

    rows = {r.check: r for r in doctor(accelerator="tpu7x-32", zone=TPU7X_ZONE)}
    assert rows["Compute Engine API"].status == "ok" and "compute.googleapis.com answers" in rows["Compute Engine API"].why
    assert rows["zone offers machine type"].status == "ok" and "4 VMs for tpu7x-32" in rows["zone offers machine type"].why
    assert "API enabled" not in rows  # the Cloud TPU API's checks are not this launch's
    wrong = {r.check: r for r in doctor(accelerator="tpu7x-32", zone=V6E_ZONE)}["zone offers machine type"]
    assert wrong.status == "failed" and wrong.why.startswith(f"{V6E_ZONE} has no tpu7x-standard-4t (tpu7x-32): zones with it")
    older = {r.check for r in doctor(accelerator="v4-8", zone="us-central2-b")}
    assert "API enabled" in older and "Compute Engine API" not in older  # v4 goes through the Cloud TPU API
