"""TPUs through Compute Engine: a single-host v6e is one instance (Google's own google-cloud-compute
client looks at it) that runs a cell, and after a Colab reset %tpu_use gives the new kernel's key
to it through its ssh-keys metadata; what Compute Engine cannot do is one line that makes nothing;
%tpu_doctor asks Compute Engine for the types it makes. The TPU7x slice (a BULK MIG) and everything
else on it is tests/test_compute_slice.py, on one shared launch."""
from __future__ import annotations

import re

import pytest

from tests.compute_fixture import Google, cloud, sandbox  # noqa: F401 - cloud is a fixture
from tpunb import manager
from tpunb.registry import Registry

TPU7X_ZONE, V6E_ZONE = "us-central1-c", "us-east5-b"


@pytest.fixture(scope="module")
def box():
    yield from sandbox(1, 0.3, 0.1, 0.1)


@pytest.mark.fresh_slice
@pytest.mark.jax
def test_a_single_host_v6e_is_one_instance_and_runs_a_cell_also_after_a_reset(cloud, cell, monkeypatch, tmp_path):
    google = Google(cloud)
    run = cell(f"%tpu_launch v6e-8 --name trillium --zone {V6E_ZONE}")
    assert run.error is None, run.shown
    vm = google.instances.get(project=cloud.project, zone=V6E_ZONE, instance="trillium")
    assert vm.machine_type.rsplit("/", 1)[-1] == "ct6e-standard-8t" and vm.scheduling.on_host_maintenance == "TERMINATE"
    out = cell("%%on_tpu\nimport jax\njax.device_count()")
    assert out.error is None and out.shown.strip() == "8", out.shown  # one host: its value, unlabelled
    image = cell("%%on_tpu\nimport subprocess\nsubprocess.run(['bash', '-c', 'python3 -c \"import sys; "
                 "print(sys.version_info[:2])\"'], capture_output=True, text=True).stdout.strip()")
    assert image.shown.strip() == "'(3, 10)'", image.shown  # Ubuntu 22.04's Python on a v6e image (TPU7x: 3.12)

    manager.detach_all()  # a Colab reset: no registry, no key; no OS Login, so the key goes into the VM's metadata
    monkeypatch.setenv("TPUNB_HOME", str(tmp_path / "reset"))
    cloud.emulator.faults(api_disabled=True)  # a project that uses only Compute Engine: the Cloud TPU API is off
    try:
        used = cell("%tpu_use trillium")
    finally:
        cloud.emulator.faults(api_disabled=False)
    assert used.error is None and "in its instances' ssh-keys metadata, as tpunb" in used.stdout, used.shown
    published = google.instances.get_guest_attributes(request={"project": cloud.project, "zone": V6E_ZONE,
                                                               "instance": "trillium", "query_path": "hostkeys/"})
    host = cloud.sshd.addresses[0]  # the new registry pins the VM's own key, as it published it, before connecting
    assert Registry(tmp_path / "reset" / "registry.db").get_host_key(host, cloud.sshd.port) == (
        "ssh-ed25519", {i.key: i.value for i in published.query_value.items}["ssh-ed25519"])
    keys = next(i.value for i in google.instances.get(project=cloud.project, zone=V6E_ZONE, instance="trillium")
                .metadata.items if i.key == "ssh-keys").splitlines()
    assert len(keys) == 2 and all(k.startswith("tpunb:ssh-ed25519 ") for k in keys)  # the launch's, and the new one
    again = cell("%%on_tpu\nimport jax\njax.device_count()")
    assert again.error is None and again.shown.strip() == "8", again.shown
    assert cell("%tpu_down trillium").error is None
    assert google.everything(V6E_ZONE)["instances"] == []


@pytest.mark.parametrize("line, message", [
    (f"v4-8 --api compute --zone {TPU7X_ZONE}", r"^v4-8 is made only through the Cloud TPU API"),
    (f"tpu7x-32 --api tpu --zone {TPU7X_ZONE}", r"^tpu7x-32 is made only through Compute Engine .*: launch it without --api tpu$"),
    (f"tpu7x-32 --queued --zone {TPU7X_ZONE}", r"^--queued \(queued resources\) is for the Cloud TPU API: under "
                                               r"Compute Engine --flex HOURS waits for flex-start capacity instead$"),
    (f"v6e-16 --race 2 --zone {V6E_ZONE}", r"^--race .* is for the Cloud TPU API: under Compute Engine zones are tried one "
                                         r"at a time.* --zone Z1,Z2 \(or --zone any\); or add --api tpu"),
    (f"v6e-8 --runtime v2-alpha-tpuv6e --zone {V6E_ZONE}", r"^--runtime .*: drop --runtime \(--jax V picks"),
    (f"tpu7x-32 --slices 2 --zone {TPU7X_ZONE}", r"^--slices \(a multislice\) is for the Cloud TPU API: under Compute "
                                                r"Engine launch one slice$"),
    (f"tpu7x-32 --zone {V6E_ZONE}", fr"^{V6E_ZONE} has no tpu7x-standard-4t \(tpu7x-32\): zones with it: "),
    ("v6e-8 --api cloud", r"^--api cloud: give tpu \(the Cloud TPU API\) or compute \(Compute Engine\)$"),
])
@pytest.mark.fresh_slice
def test_what_compute_engine_cannot_do_is_one_line_and_makes_nothing(cloud, cell, line, message):
    run = cell(f"%tpu_launch {line}")
    assert run.error is not None and re.search(message, str(run.error)), (str(run.error), run.shown)
    assert "Traceback" not in run.shown
    assert all(not v for v in Google(cloud).everything(TPU7X_ZONE).values())


def test_doctor_asks_compute_engine_for_a_type_it_makes(cloud):
    from tpunb.magics.checkup import doctor

    rows = {r.check: r for r in doctor(accelerator="tpu7x-32", zone=TPU7X_ZONE)}
    assert rows["Compute Engine API"].status == "ok" and "compute.googleapis.com answers" in rows["Compute Engine API"].why
    assert rows["zone offers machine type"].status == "ok" and "4 VMs for tpu7x-32" in rows["zone offers machine type"].why
    assert "API enabled" not in rows  # the Cloud TPU API's checks are not this launch's
    wrong = {r.check: r for r in doctor(accelerator="tpu7x-32", zone=V6E_ZONE)}["zone offers machine type"]
    assert wrong.status == "failed" and wrong.why.startswith(f"{V6E_ZONE} has no tpu7x-standard-4t (tpu7x-32): zones with it")
    older = {r.check for r in doctor(accelerator="v4-8", zone="us-central2-b")}
    assert "API enabled" in older and "Compute Engine API" not in older  # v4 goes through the Cloud TPU API
