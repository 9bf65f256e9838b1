"""Cost safety on Compute Engine. Every slice's worker 0 arms a boot watchdog, grace-only without
--idle-delete: a launch abandoned while its VMs came up loses its VM (or its MIG, then the next
survey its template and policy), while a kernel that says its launch is done ends the watchdog. A
survey deletes a MIG still waiting past the deadline its launch stamped that no registry holds. A
Spot MIG that loses a VM is deleted whole and the notebook says so in one line. Flex-start shows no
price it cannot cite."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.compute_fixture import Google, cloud, sandbox  # noqa: F401 - cloud is a fixture
from tests.conftest import wait_for
from tpunb.provision.gcp import apis
from tpunb import catalog, manager
from tpunb.errors import ProvisionError
from tpunb.provision.gcp import compute
from tpunb.provision.gcp.shared import new_launch
from tpunb.provision.gcp.compute import VmSpec, bodies, first_granted, found
from tpunb.provision.gcp.config import CloudOptions
from tpunb.registry import Registry, SliceRecord

pytestmark = pytest.mark.sandbox

V6E_ZONE, V5P_ZONE, TPU7X_ZONE = "us-east5-b", "us-east5-a", "us-central1-c"
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGx0 someone"


@pytest.fixture(scope="module")
def box():
    yield from sandbox(3, 0.1, 0.05, 0.05)


def spec(box, name: str, accelerator: str, zone: str, **fields) -> VmSpec:
    return VmSpec(name, apis.compute_shape(accelerator), zone, "someone@example.com", "tpunb", KEY, False,
                  project=box.project, launch=new_launch(), **fields)


def orphans(cell, ip) -> dict[str, str]:
    cell("%tpu_status")
    return {row["slice"]: row["cloud_state"] for _, row in ip.user_ns["_"].iterrows()
            if str(row["state"]).startswith("ORPHAN")}


def test_a_launch_abandoned_as_its_vms_came_up_loses_them_to_the_boot_watchdog(cloud, cell, ip, isolated_home,
                                                                             monkeypatch):
    google = Google(cloud)
    for vm in (spec(cloud, "lone", "v6e-8", V6E_ZONE, idle_grace=1.5), spec(cloud, "herd", "v5p-16", V5P_ZONE,
                                                                           idle_grace=1.5)):
        record = SliceRecord(name=vm.name, accelerator=vm.shape.accelerator, backend="gcp", state="creating",
                             spec={"api": "compute", "project": cloud.project, "zone": vm.zone})
        hosts, _ = first_granted(cloud.project, vm, [vm.zone], record, Registry(isolated_home / "dead-kernel.db"),
                                 lambda *_: None, CloudOptions())  # and then the kernel died: nobody attaches
        assert len(hosts) == vm.shape.vms
    wait_for(lambda: not google.everything(V6E_ZONE)["instances"], 30, "the watchdog to delete the lone VM")
    wait_for(lambda: not google.everything(V5P_ZONE)["migs"], 30, "the watchdog to delete the MIG")
    left = google.everything(V5P_ZONE)
    assert left == {"instances": [], "migs": [], "templates": ["herd-tpunb-t"], "policies": ["herd-tpunb-wp"]}, left
    monkeypatch.setattr(found, "LEFTOVER_AGE", 0.0)  # as if no launch could be making them any more
    assert orphans(cell, ip) == {}
    assert all(not v for z in (V6E_ZONE, V5P_ZONE) for v in google.everything(z).values())


@pytest.mark.fresh_slice
def test_a_kernel_that_says_its_launch_is_done_ends_the_grace_only_watchdog_which_says_what_it_may_not(
        cloud, cell, monkeypatch):
    google = Google(cloud)
    monkeypatch.setattr(compute, "boot_grace", lambda shape, opts: 1.5)
    account = f"{cloud.project}-compute@developer.gserviceaccount.com"  # the VMs' (the default service account)
    cloud.emulator.accounts(permissions={account: ["roles/tpu.admin"]})  # it may not delete the VM: said at once
    try:
        run = cell(f"%tpu_launch v6e-8 --name kept --zone {V6E_ZONE} --no-setup")
    finally:
        cloud.emulator.accounts(permissions={account: None})
    assert run.error is None, run.shown
    assert ("[tpunb] the boot watchdog (which deletes a slice whose launching kernel died) cannot delete kept: its "
            f"watchdog says 403 {account} lacks compute.instances.delete in project {cloud.project}") in run.shown
    vm = google.instances.get(project=cloud.project, zone=V6E_ZONE, instance="kept")
    armed = next(i.value for i in vm.metadata.items if i.key == "tpunb-idle")
    assert '"seconds": 0.0' in armed and '"grace": 1.5' in armed  # grace-only, without --idle-delete
    address = manager.current().record.hosts[0].info.internal_ip
    log = Path(cloud.sshd.host_environment(address)["TPUNB_HOST_DIR"]) / "idle.log"
    wait_for(lambda: log.exists() and "the grace-only watchdog exits" in log.read_text(), 30, "the watchdog to end")
    assert google.instances.get(project=cloud.project, zone=V6E_ZONE, instance="kept").status == "RUNNING"
    assert cell("%%on_tpu\n'still here'").shown.strip() == "'still here'"
    assert cell("%tpu_down kept").error is None


def test_a_survey_deletes_a_waiting_mig_past_its_deadline_that_no_registry_holds(cloud, cell, ip):
    google, p, region = Google(cloud), cloud.project, catalog.region_of(TPU7X_ZONE)
    cloud.emulator.faults(no_capacity=[TPU7X_ZONE])
    for name, deadline in (("late", 1.0), ("fresh", 4e9)):  # 1970, and long after this test
        vm = spec(cloud, name, "tpu7x-16", TPU7X_ZONE, deadline=deadline)
        google.policies.insert_unary(project=p, region=region, resource_policy_resource=bodies.workload_policy(vm))
        google.templates.insert_unary(project=p, region=region, instance_template_resource=bodies.template(vm))
        google.migs.insert_unary(project=p, zone=TPU7X_ZONE, instance_group_manager_resource=bodies.mig(vm, p))
    status = cell("%tpu_status")
    assert f"deleted late in {p}/{TPU7X_ZONE}: a MIG still waiting for capacity past its launch's deadline" in \
        status.stdout, status.shown
    seen = {row["slice"]: row["cloud_state"] for _, row in ip.user_ns["_"].iterrows()}
    assert seen == {"fresh": "WAITING_FOR_RESOURCES"}, seen
    assert sorted(google.everything(TPU7X_ZONE)["migs"]) == ["fresh"]
    assert google.everything(TPU7X_ZONE)["templates"] == ["fresh-tpunb-t"]
    assert cell("%tpu_down fresh").error is None and all(not v for v in google.everything(TPU7X_ZONE).values())


@pytest.mark.fresh_slice
def test_a_spot_mig_that_loses_a_vm_is_deleted_whole(cloud, cell, monkeypatch):
    google = Google(cloud)
    monkeypatch.setenv("TPUNB_WATCH_INTERVAL", "0.2")
    run = cell(f"%tpu_launch v5p-16 --spot --name spotted --zone {V5P_ZONE} --no-setup")
    assert run.error is None, run.shown
    victim = manager.current().record.hosts[1].info.extra["instance"]
    cloud.preempt(victim, notice=0)
    wait_for(lambda: all(not v for v in google.everything(V5P_ZONE).values()), 30, "the MIG, template and policy to go")
    lost = cell("%%on_tpu\n1")
    assert isinstance(lost.error, ProvisionError) and "\n" not in str(lost.error), lost.shown
    assert f"its VM {victim} (host 1) is TERMINATED (spot capacity was reclaimed); a Spot slice that lost a VM cannot " \
           "be whole again, so its MIG, template and policy were deleted (the other VMs no longer bill)" in \
           str(lost.error), str(lost.error)
    assert cell("%tpu_down spotted").error is None


@pytest.mark.fresh_slice
def test_flex_start_shows_no_price_it_cannot_cite(cloud, cell, ip):
    run = cell(f"%tpu_launch v6e-8 --flex 1 --name flexed --zone {V6E_ZONE} --no-setup")
    assert run.error is None and "(flex-start price not known)" in run.stdout, run.shown
    assert "$" not in run.stdout.splitlines()[0]  # never the on-demand rate in its place
    cell("%tpu_status")
    frame = ip.user_ns["_"]
    assert frame[frame["slice"] == "flexed"]["usd_per_hour"].isna().all()
    assert cell("%tpu_down flexed").error is None


STATUS_ELSEWHERE = """
import json
from IPython.core.interactiveshell import InteractiveShell
from tpunb.server.model import list_slices

shell = InteractiveShell.instance()
shell.run_line_magic("load_ext", "tpunb")
frame = shell.run_line_magic("tpu_status", "")
print(json.dumps({"status": frame[["slice", "cloud_state"]].to_dict("records"),
                  "sidebar": [(s["name"], s["state"]) for s in list_slices()["slices"]]}))
"""


def test_status_without_credentials_lists_the_slice_and_why_its_state_is_unknown(tmp_path):
    """The JupyterLab server behind the sidebar, or a second kernel, with the registry of a
    Compute Engine slice but no Google credentials (none configured, no metadata server): both
    still list the slice, its cloud state unknown with the reason."""
    import json
    import os
    import subprocess
    import sys

    from tpunb.registry import HostInfo, HostRecord

    home = tmp_path / "server-home"
    home.mkdir()
    hosts = [HostRecord(i, f"10.0.0.{i + 2}", HostInfo(internal_ip=f"10.0.0.{i + 2}", extra={"instance": f"far-{i}"}))
             for i in range(2)]
    Registry(home / "registry.db").save_slice(SliceRecord(
        name="far", accelerator="tpu7x-16", backend="gcp", state="running", hosts=hosts,
        spec={"api": "compute", "project": "real-project", "zone": TPU7X_ZONE, "vms": 2, "launch": "ab12cd34"}))
    Registry(home / "registry.db").save_slice(SliceRecord(  # and a Cloud TPU node: its API cannot be asked either
        name="node", accelerator="v4-8", backend="gcp", state="running", hosts=hosts[:1],
        spec={"project": "real-project", "zone": "us-central2-b"}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TPUNB_", "GOOGLE_", "CLOUDSDK_", "GCE_"))}
    env.update(TPUNB_HOME=str(home), GOOGLE_CLOUD_PROJECT="real-project", CLOUDSDK_CONFIG=str(tmp_path / "gcloud"),
               NO_GCE_CHECK="true", PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    done = subprocess.run([sys.executable, "-c", STATUS_ELSEWHERE], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    unknown = "UNKNOWN (no Google Cloud credentials: run `gcloud auth application-default login`"
    assert sorted(r["slice"] for r in seen["status"]) == ["far", "far", "node"], seen  # one row a host
    assert all(r["cloud_state"].startswith(unknown) for r in seen["status"]), seen
    assert sorted(name for name, _ in seen["sidebar"]) == ["far", "node"], seen
    assert all(state.startswith(unknown) for _, state in seen["sidebar"]), seen
