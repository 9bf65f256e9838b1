"""A Compute Engine slice ends as a Cloud TPU node does: its idle watchdog on worker 0 deletes the
MIG (or the instance) with the VM's own token, having read the other VMs' guest attributes and
checked its permission against Compute Engine; the template and policy it leaves are deleted by
the next survey; a Spot VM's preemption and a VM its MIG recreates are a lost slice, said in one
line, and --recover relaunches it. Google's own client checks that nothing is left.

Two launches serve every check: a single-host v6e-8 (Spot, preempted, recovered, then idle-deleted)
and the smallest multi-host shape, a v5p-16 of 2 VMs (its watchdog's checks, a recreated VM, then
its idle deletion, last); both with --no-setup (their cells need no JAX, and a fresh VM's environment
build is what would cost most here). %tpu_doctor's quota check needs no launch."""
from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.compute_fixture import Google, cloud, sandbox  # noqa: F401 - cloud is a fixture
from tests.conftest import wait_for
from tpunb import manager
from tpunb.errors import ProvisionError
from tpunb.host.standalone import idle
from tpunb.status import readable

V6E_ZONE, V5P_ZONE = "us-east5-b", "us-east5-a"
#: after the idle limit, how long the watchdog may take to delete (its look every POLL s, the delete)
BOUND = idle.POLL + 10.0


@pytest.fixture(scope="module")
def box():
    yield from sandbox(5, 0.3, 0.1, 0.1)


@pytest.fixture
def watched(cloud, monkeypatch):
    monkeypatch.setenv("TPUNB_WATCH_INTERVAL", "0.2")
    monkeypatch.delenv("TPUNB_IDLE_DELETE", raising=False)
    yield cloud


def metadata(box, address: str, path: str, value: str | None = None) -> str:
    """What VM ``address``'s metadata server answers (``value``: PUT it, as the VM itself would)."""
    host = box.sshd.host_environment(address)["GCE_METADATA_HOST"]
    request = urllib.request.Request(f"http://{host}/computeMetadata/v1/{path}", headers={"Metadata-Flavor": "Google"},
                                     method="GET" if value is None else "PUT",
                                     data=None if value is None else value.encode())
    with urllib.request.urlopen(request, timeout=5) as response:
        return response.read().decode()


@pytest.mark.fresh_slice
def test_a_preempted_spot_vm_is_said_recovered_and_idle_deleted(watched, cell):
    google, box = Google(watched), watched
    run = cell(f"%tpu_launch v6e-8 --spot --name spotty --zone {V6E_ZONE} --idle-delete 4s --no-setup")
    assert run.error is None, run.shown
    assert "or 4s without a cell (--idle-delete)" in run.stdout, run.stdout
    vm = google.instances.get(project=box.project, zone=V6E_ZONE, instance="spotty")
    config = json.loads(next(i.value for i in vm.metadata.items if i.key == idle.METADATA_ATTRIBUTE))
    assert config["node"] == f"projects/{box.project}/zones/{V6E_ZONE}/instances/spotty" and config["seconds"] == 4
    assert vm.scheduling.provisioning_model == "SPOT"

    box.preempt("spotty", notice=1.0)  # Compute Engine gives Spot 30 s; the sandbox's test asks 1
    sl = manager.current()
    wait_for(lambda: sl.node.vms and sl.node.vms[0].status == "TERMINATED", 15, "the watch to see the VM TERMINATED")
    refused = cell("%%on_tpu\n1")
    assert isinstance(refused.error, ProvisionError) and "\n" not in str(refused.error), refused.shown
    assert str(refused.error) == ("slice spotty cannot run cells: its VM spotty (host 0) is TERMINATED (spot capacity "
                                  "was reclaimed). Relaunch it with %tpu_launch --recover spotty, or delete it with "
                                  "%tpu_down spotty")

    recovered = cell("%tpu_launch --recover spotty")
    assert recovered.error is None, recovered.shown
    assert cell("%%on_tpu\n6 * 7").shown.strip() == "42"
    # no cell now: the recovered VM's own watchdog deletes the instance (there is nothing else to leave)
    wait_for(lambda: not google.everything(V6E_ZONE)["instances"], 4 + BOUND, "the watchdog to delete the instance")
    wait_for(lambda: manager.current().node.vms is None, 5, "the watch to see it gone")
    gone = cell("%%on_tpu\n1")
    assert isinstance(gone.error, ProvisionError) and "its VM spotty no longer exists in " in str(gone.error)
    assert "(its idle autodelete deletes it after 4s without a cell)" in str(gone.error), str(gone.error)
    assert cell("%tpu_down spotty").error is None
    assert google.everything(V6E_ZONE) == {"instances": [], "migs": [], "templates": [], "policies": []}


@pytest.mark.fresh_slice
def test_a_slices_watchdog_checks_reads_and_deletes_through_compute_engine(watched, cell, ip, monkeypatch, tmp_path):
    google, box = Google(watched), watched
    calls = box.emulator.record_compute()
    run = cell(f"%tpu_launch v5p-16 --name pair --zone {V5P_ZONE} --idle-delete 10s --no-setup")
    assert run.error is None, run.shown
    sl = manager.current()
    worker0, worker1 = (h.info.extra["instance"] for h in sl.record.hosts)
    addresses = [h.info.internal_ip for h in sl.record.hosts]
    config = json.loads(metadata(box, addresses[1], f"instance/attributes/{idle.METADATA_ATTRIBUTE}"))
    assert config["node"] == f"projects/{box.project}/zones/{V5P_ZONE}/instanceGroupManagers/pair"
    assert metadata(box, addresses[0], "instance/attributes/worker-id") == "0"  # no agent-worker-number here
    host_dirs = [Path(box.sshd.host_environment(a)["TPUNB_HOST_DIR"]) for a in addresses]
    assert [(d / idle.STATE).exists() for d in host_dirs] == [True, False]  # armed on worker 0 only

    # as the VM: its permission check asks for Compute Engine's delete permission of the MIG
    monkeypatch.setenv("GCE_METADATA_HOST", box.sshd.host_environment(addresses[0])["GCE_METADATA_HOST"])
    monkeypatch.setenv("TPUNB_HOST_DIR", str(tmp_path))
    state = {**config, "seconds": 10}
    assert idle.permission_problem(state) is None
    account = metadata(box, addresses[0], "instance/service-accounts/default/email")
    box.emulator.accounts(permissions={account: ["roles/tpu.admin"]})
    deletes = ["roles/compute.instanceAdmin.v1", "compute.resourcePolicies.delete"]  # MIGs, VMs, templates, policies
    try:
        problem = idle.permission_problem(state)
        box.emulator.accounts(permissions={account: ["roles/compute.instanceAdmin.v1"]})
        no_policies = idle.permission_problem(state)
    finally:
        box.emulator.accounts(permissions={account: deletes})
    assert problem == (f"403 {account} lacks compute.instanceGroupManagers.delete, compute.instanceTemplates.delete, "
                       f"compute.resourcePolicies.delete in project {box.project}")  # all three, in one line
    assert no_policies == f"403 {account} lacks compute.resourcePolicies.delete in project {box.project}"
    assert idle.permission_problem(state) is None
    idle.say_problem(problem)  # as the watchdog says it, in worker 0's guest attribute: the kernel shows it
    sl.node._problem = (float("-inf"), None)
    cell("%tpu_status")
    assert readable(ip.user_ns["_"])["idle_delete_in"].iloc[0] == f"idle delete failing: {problem}"
    idle.say_problem("")

    # the other VMs' services, read as the watchdog reads them: listManagedInstances, then getGuestAttributes
    metadata(box, addresses[1], f"instance/guest-attributes/{idle.SERVING_ATTRIBUTE}", "1000.5")
    assert idle.served_elsewhere(state) == (1000.5, worker1)

    # the MIG recreates worker 1 under the running slice: a lost host, said in one line
    box.emulator.recreate(worker1)
    wait_for(lambda: sl.node.lost_reason(), 15, "the watch to see the recreated VM")
    lost = cell("%%on_tpu\n1")
    assert isinstance(lost.error, ProvisionError) and "\n" not in str(lost.error), lost.shown
    assert str(lost.error).startswith(f"slice pair cannot run cells: its MIG recreated VM {worker1} (host 1): a new VM "
                                      "with a fresh disk"), str(lost.error)

    # no cell since the launch: worker 0's watchdog deletes the MIG, its own VM with it
    wait_for(lambda: not google.everything(V5P_ZONE)["migs"], 10 + BOUND, "the watchdog to delete the MIG")
    left = google.everything(V5P_ZONE)
    assert left == {"instances": [], "migs": [], "templates": ["pair-tpunb-t"], "policies": ["pair-tpunb-wp"]}, left
    mig = f"/zones/{V5P_ZONE}/instanceGroupManagers/pair"
    deleted = next(i for i, c in enumerate(calls) if c.method == "DELETE" and c.path.endswith(mig))
    read = [c.path.rsplit("/", 2)[-2] for c in calls[:deleted] if c.path.endswith("/getGuestAttributes")
            and c.query.get("queryPath") == "tpunb/"]
    assert worker0 in read and worker1 in read  # it read every VM before it deleted
    # the next survey deletes the template and policy left behind, as leftovers of a recorded slice
    assert cell("%tpu_status").error is None
    assert google.everything(V5P_ZONE) == {"instances": [], "migs": [], "templates": [], "policies": []}
    gone = cell("%%on_tpu\n1")
    assert "its MIG pair no longer exists in " in str(gone.error) and "idle autodelete" in str(gone.error)
    assert cell("%tpu_down pair").error is None


def test_doctor_reads_the_compute_engine_tpu_quota_the_launch_spends(watched):
    from tpunb.magics.checkup import doctor

    def quota_row() -> tuple[str, str]:
        row = {r.check: r for r in doctor(accelerator="v6e-16", zone=V6E_ZONE)}["Compute Engine TPU quota"]
        return row.status, row.why

    family, limits = "TPUS-PER-TPU-FAMILY-per-project-region", f"https://console.cloud.google.com/iam-admin/quotas?project={watched.project}"
    assert quota_row() == ("ok", f"{family} in us-east5: 2048 chips, v6e-16 needs 16")
    try:
        watched.emulator.compute_faults(quotas={family: {"us-east5": 8}})
        assert quota_row() == ("failed", f"{family} in us-east5 is 8 chips, v6e-16 needs 16: request more at {limits}")
        watched.emulator.compute_faults(quotas={family: {"us-east5": None}})
        assert quota_row() == ("warning", f"{family} in us-east5 has no value set (launches have been refused so): "
                                          f"request 16 chips at {limits}")
    finally:
        watched.emulator.compute_faults(quotas=None)


@pytest.mark.parametrize("attributes, multi_host, worker", [
    ({"agent-worker-number": "2", "worker-id": "5"}, True, "2"),  # a Cloud TPU VM
    ({"worker-id": "1", "tpu-env": "TPU_WORKER_ID: '3'\n"}, True, "1"),
    ({"tpu-env": "TOPOLOGY: '2x2x2'\nTPU_WORKER_ID: '3'\n"}, True, "3"),
    ({}, False, "0"),  # a single instance is worker 0 (its handler armed it as one VM)
    ({}, True, ""),  # a MIG's VM that says nothing: not worker 0
])
def test_the_boot_finds_worker_0_without_agent_worker_number(monkeypatch, attributes, multi_host, worker):
    def answer(path: str, timeout: float = 5.0) -> str:
        key = path.removeprefix("instance/attributes/")
        if key not in attributes:  # as the metadata server answers a key it does not have
            raise urllib.error.HTTPError(path, 404, "Not Found", None, None)
        return attributes[key]

    monkeypatch.setattr(idle, "metadata", answer)
    from tpunb.provision.gcp.compute.bodies import idle_config

    assert idle.worker_id(idle_config("p", "us-east5-a", "n", 0, multi_host)) == worker
