"""What a real project brings to a first Compute Engine launch, modelled by the sandbox, each tested
with launches that make no environment (``--no-setup``: the image's own Python runs the agent):

- reservations: a calendar-mode one takes only RESERVATION_BOUND VMs, found from its future
  reservation; a refused list leaves it to ``--reservation-bound``; a shared one is read in its
  owner's project; ``--spot`` never consumes one;
- organisation policies: requireOsLogin (read, or guessed from the refusal), requireShieldedVm;
- ``--keep``, names that fit a MIG's, a survey that meets an unreachable zone, a flex-start v6e-8
  refused as one VM and granted as two, an on-demand VM deleted while it is made, the boot disk,
  a Shared VPC, the idle watchdog's grace through activation, TPU7x's allowlist, and both spellings
  of the metadata server's address.
"""
from __future__ import annotations

import dataclasses
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.compute_fixture import Google, cloud, made, sandbox  # noqa: F401 - cloud is a fixture
from tests.conftest import wait_for
from tpunb.provision.gcp import apis
from tpunb import manager
from tpunb.sandbox.iam.accounts import USER
from tpunb.errors import AuthenticationError, ProvisionError
from tpunb.host import jax_start
from tpunb.provision.gcp.compute import VmSpec, first_granted, teardown
from tpunb.provision.gcp.config import CloudOptions
from tpunb.registry import Registry, SliceRecord

pytestmark = pytest.mark.sandbox

V6E_ZONE, TPU7X_ZONE = "us-east5-b", "us-central1-c"
OS_LOGIN, SHIELDED = "constraints/compute.requireOsLogin", "constraints/compute.requireShieldedVm"


@pytest.fixture(scope="module")
def box():
    yield from sandbox(2, 0.2, 0.05, 0.05)


@pytest.fixture
def project(cloud):
    """The module's sandbox; afterwards its Compute Engine faults, accounts and org policies are as
    they started, and nothing of a launch is left."""
    yield cloud
    cloud.emulator.compute_faults(reservations=None, future_reservations_denied=None, subnets=None,
                                  hidden_types=None)
    cloud.emulator.accounts(permissions={USER: None}, org_policies={OS_LOGIN: False, SHIELDED: False})
    cloud.emulator.faults(unreachable=None, slow_create=0)


def instance(project, name: str, zone: str = V6E_ZONE):
    return Google(project).instances.get(project=project.project, zone=zone, instance=name)


def nothing_left(project, *zones: str) -> bool:
    return all(not v for z in zones for v in Google(project).everything(z).values())


# -- reservations -----------------------------------------------------------------------------------

@pytest.mark.fresh_slice
def test_a_calendar_mode_reservation_gets_reservation_bound_vms_in_its_zone(project, cell):
    project.emulator.compute_faults(reservations={"cal-res": {"zone": V6E_ZONE, "mode": "CALENDAR"}})
    run = cell("%tpu_launch v6e-4 --reservation cal-res --no-setup --name cal")  # no --zone: the reservation's
    assert run.error is None, run.shown
    vm = instance(project, "cal")
    s = vm.scheduling
    assert (s.provisioning_model, s.instance_termination_action, s.automatic_restart, s.on_host_maintenance) == (
        "RESERVATION_BOUND", "DELETE", False, "TERMINATE")
    assert list(vm.reservation_affinity.values) == ["cal-res"]
    assert cell("%tpu_down cal").error is None


@pytest.mark.fresh_slice
def test_a_refused_future_reservation_list_leaves_it_to_the_flag_and_the_refusal_says_which(project, cell):
    project.emulator.compute_faults(reservations={"cal-res": {"zone": V6E_ZONE, "mode": "CALENDAR"}},
                                    future_reservations_denied=True)
    run = cell("%tpu_launch v6e-4 --reservation cal-res --no-setup --name guessed")
    text = str(run.error)
    assert "cannot read sandbox-project's future reservations: consuming cal-res with standard VMs" in run.shown
    assert text.startswith("reservation cal-res takes only reservation-bound VMs (a future reservation in calendar "
                           "mode delivered it): relaunch with --reservation-bound (Compute Engine said:"), text
    assert "\n" not in text and nothing_left(project, V6E_ZONE)
    bound = cell("%tpu_launch v6e-4 --reservation cal-res --reservation-bound --no-setup --name bound")
    assert bound.error is None and instance(project, "bound").scheduling.provisioning_model == "RESERVATION_BOUND"
    assert cell("%tpu_down bound").error is None


@pytest.mark.fresh_slice
def test_a_shared_reservation_is_read_in_its_owners_project(project, cell):
    project.emulator.compute_faults(reservations={"team": {"zone": V6E_ZONE, "project": "owner-project",
                                                           "shared_with": [project.project]}})
    run = cell("%tpu_launch v6e-4 --reservation projects/owner-project/reservations/team --no-setup --name shared")
    assert run.error is None, run.shown
    vm = instance(project, "shared")
    assert list(vm.reservation_affinity.values) == ["projects/owner-project/reservations/team"]
    assert vm.scheduling.provisioning_model != "RESERVATION_BOUND"  # a standard reservation
    assert cell("%tpu_down shared").error is None
    wrong = str(cell(f"%tpu_launch v6e-4 --reservation team --zone {V6E_ZONE} --no-setup --name mine").error)
    assert wrong.startswith("project sandbox-project has no reservation team") and nothing_left(project, V6E_ZONE)
    spot = str(cell("%tpu_launch v6e-4 --spot --reservation team --no-setup").error)
    assert spot.startswith("--spot with --reservation: Compute Engine cannot consume a reservation with Spot VMs")


# -- organisation policies, --keep ------------------------------------------------------------------

@pytest.mark.fresh_slice
def test_os_login_enforced_by_the_organisation_is_read_or_named_and_keep_keeps(project, cell, isolated_home):
    project.emulator.accounts(org_policies={OS_LOGIN: True})
    run = cell(f"%tpu_launch v6e-4 --zone {V6E_ZONE} --no-setup --name org-login")
    assert run.error is None, run.shown  # read from the effective policy: logged in through OS Login
    assert manager.current().record.spec.get("os_login") and manager.current().record.spec["user"] != "tpunb"
    assert cell("%tpu_down org-login").error is None
    project.emulator.accounts(permissions={USER: ["compute.*", "iam.serviceAccounts.actAs"]})  # cannot read it
    with pytest.raises(AuthenticationError, match="OS Login is probably enforced by your organisation"):
        manager.launch("v6e-4", name="guessed", backend="gcp", zone=V6E_ZONE, no_setup=True, connect_wait=1)
    assert nothing_left(project, V6E_ZONE)
    with pytest.raises(AuthenticationError):
        manager.launch("v6e-4", name="kept", backend="gcp", zone=V6E_ZONE, no_setup=True, connect_wait=1, keep=True)
    kept = Registry(isolated_home / "registry.db").get_slice("kept")
    assert kept is not None and kept.state == "kept" and instance(project, "kept").status == "RUNNING"
    project.emulator.accounts(permissions={USER: None})
    assert cell("%tpu_down kept").error is None and nothing_left(project, V6E_ZONE)


@pytest.mark.fresh_slice
def test_an_organisation_that_requires_shielded_vm_is_named(project, cell):
    project.emulator.accounts(org_policies={SHIELDED: True})
    run = cell(f"%tpu_launch v6e-4 --zone {V6E_ZONE} --no-setup --name shielded")
    text = str(run.error)
    assert text.startswith("your organisation requires Shielded VM with Secure Boot "
                           "(constraints/compute.requireShieldedVm) in project sandbox-project"), text
    assert "disable-enforce compute.requireShieldedVm" in text and "\n" not in text
    assert "Compute Engine will most likely refuse the VMs" in run.shown  # said before anything was made
    assert nothing_left(project, V6E_ZONE)


# -- names, the survey, capacity --------------------------------------------------------------------

@pytest.mark.fresh_slice
def test_a_multi_host_name_that_its_policy_could_not_carry_is_refused_first(project, cell):
    name = "n" * 55
    text = str(cell(f"%tpu_launch tpu7x-16 --zone {TPU7X_ZONE} --no-setup --name {name}").error)
    assert text == (f"slice name {name!r} has 55 characters: a multi-host slice's name has at most 54 (its workload "
                    "policy is NAME-tpunb-wp, at most 63): give a shorter --name")
    assert nothing_left(project, TPU7X_ZONE)


def test_a_survey_that_cannot_reach_a_zone_deletes_nothing_there(project, cell, ip, isolated_home):
    """A recorded MIG slice whose zone the aggregated lists cannot reach: its template and policy
    (regional, so listed) are not leftovers, and its state is unknown, not GONE."""
    google = Google(project)
    made(google, "far", "tpu7x-16", TPU7X_ZONE)
    Registry(isolated_home / "registry.db").save_slice(SliceRecord(
        name="far", accelerator="tpu7x-16", backend="gcp", state="running",
        spec={"api": "compute", "project": project.project, "zone": TPU7X_ZONE, "vms": 2}))
    project.emulator.faults(unreachable=[TPU7X_ZONE])
    assert cell("%tpu_status").error is None
    frame = ip.user_ns["_"]
    assert list(frame[frame["slice"] == "far"]["cloud_state"]) == [f"UNKNOWN (Compute Engine could not reach "
                                                                   f"{TPU7X_ZONE} now)"]
    left = google.everything(TPU7X_ZONE)  # zonal lists reach the zone: only the aggregated ones do not
    assert (left["migs"], left["templates"], left["policies"]) == (["far"], ["far-tpunb-t"], ["far-tpunb-wp"])
    project.emulator.faults(unreachable=None)
    assert cell("%tpu_down far").error is None and nothing_left(project, TPU7X_ZONE)


@pytest.mark.fresh_slice
def test_a_flex_start_v6e_8_refused_as_one_vm_is_granted_as_two(project, cell):
    run = cell("%tpu_launch v6e-8 --flex 1 --zone us-east5-a --no-setup --name flexed")
    assert run.error is None, run.shown
    assert "ct6e-standard-8t refused under flex-start" in run.shown and "INTERNAL_ERROR" in run.shown, run.shown
    sl = manager.current()
    assert len(sl.record.hosts) == 2 and sl.record.accelerator == "v6e-8"
    template = Google(project).templates.get(project=project.project, region="us-east5", instance_template="flexed-tpunb-t")
    assert template.properties.machine_type == "ct6e-standard-4t"
    policy = Google(project).policies.get(project=project.project, region="us-east5", resource_policy="flexed-tpunb-wp")
    assert policy.workload_policy.accelerator_topology == "2x4"
    assert cell("%tpu_down flexed").error is None and nothing_left(project, "us-east5-a")


def test_an_on_demand_vm_deleted_while_it_is_made_is_said_so(project, isolated_home):
    project.emulator.faults(slow_create=1.0)
    google = Google(project)
    vm = VmSpec("vanished", apis.compute_shape("v6e-4"), V6E_ZONE, "someone@example.com", "tpunb",
                "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGx0 someone", False)
    record = SliceRecord(name="vanished", accelerator="v6e-4", backend="gcp", state="creating",
                         spec={"api": "compute", "project": project.project, "zone": V6E_ZONE})

    def delete_once_made() -> None:
        wait_for(lambda: "vanished" in google.everything(V6E_ZONE)["instances"], 20, "the VM to exist")
        google.instances.delete_unary(project=project.project, zone=V6E_ZONE, instance="vanished")

    threading.Thread(target=delete_once_made, daemon=True).start()
    with pytest.raises(ProvisionError, match=r"the VM vanished disappeared while it was being created: someone \(or "
                                             r"something\) in project sandbox-project deleted it"):
        first_granted(project.project, vm, [V6E_ZONE], record, Registry(isolated_home / "registry.db"),
                      lambda *_: None, CloudOptions())
    assert teardown(project.project, V6E_ZONE, "vanished", vms=1) == ""


def test_a_flex_start_vm_is_followed_by_its_status_while_its_insert_still_runs(project, isolated_home):
    """Google's insert of a flex-start VM may stay RUNNING until capacity comes (up to 2 h; the
    sandbox holds it so): the launch says it waits for capacity from the VM's PENDING status meanwhile."""
    project.emulator.faults(no_capacity=[V6E_ZONE])
    vm = dataclasses.replace(VmSpec("queued", apis.compute_shape("v6e-4"), V6E_ZONE, "someone@example.com",
                                    "tpunb", "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGx0 someone", False), flex_hours=1)
    record = SliceRecord(name="queued", accelerator="v6e-4", backend="gcp", state="creating",
                         spec={"api": "compute", "project": project.project, "zone": V6E_ZONE})
    running_inserts = []

    def say(text: str, _: float) -> None:
        if "waiting for capacity" in text and not running_inserts:
            running_inserts.extend(project.emulator.state()["compute"]["pendingOperations"])
            project.emulator.faults(no_capacity=False)  # capacity comes once the launch says it waits

    try:
        hosts, _ = first_granted(project.project, vm, [V6E_ZONE], record, Registry(isolated_home / "registry.db"), say,
                                 CloudOptions(flex=1, timeout=600))
    finally:
        project.emulator.faults(no_capacity=False)
    assert len(hosts) == 1 and any(path.startswith(f"projects/{project.project}/zones/{V6E_ZONE}/operations/")
                                   for path in running_inserts), running_inserts
    assert teardown(project.project, V6E_ZONE, "queued", vms=1) == ""


@pytest.mark.fresh_slice
def test_a_shared_vpc_slice_with_its_disk_size_and_an_idle_grace_through_activation(project, cell):
    project.emulator.compute_faults(subnets=[{"project": "host-project", "region": "us-central1", "name": "tpu-sub",
                                              "network": "shared"}])
    run = cell(f"%tpu_launch tpu7x-16 --zone {TPU7X_ZONE} --no-setup --disk-size 500 --idle-delete 60s --name wide "
               "--network projects/host-project/global/networks/shared "
               "--subnetwork projects/host-project/regions/us-central1/subnetworks/tpu-sub")
    assert run.error is None, run.shown
    assert "2 x tpu7x-standard-4t (a MIG, topology 2x2x2, 8 chips, 16 JAX devices)" in run.shown, run.shown
    properties = Google(project).templates.get(project=project.project, region="us-central1",
                                               instance_template="wide-tpunb-t").properties
    assert properties.disks[0].initialize_params.disk_size_gb == 500
    assert properties.network_interfaces[0].network == "projects/host-project/global/networks/shared"
    assert properties.network_interfaces[0].subnetwork == "projects/host-project/regions/us-central1/subnetworks/tpu-sub"
    idle = json.loads(next(i.value for i in properties.metadata.items if i.key == "tpunb-idle"))
    assert idle["grace"] >= 180 + 600 + 2 * 30  # the connect wait after a 2-VM topology's activation
    vm = Google(project).instances.list(project=project.project, zone=TPU7X_ZONE)
    assert {v.network_interfaces[0].network.rsplit("/", 4)[-4] for v in vm} == {"host-project"}
    assert cell("%tpu_down wide").error is None
    mangled = str(cell(f"%tpu_launch tpu7x-16 --zone {TPU7X_ZONE} --no-setup --network projects/x/networks/y").error)
    assert mangled.startswith("--network projects/x/networks/y: give a network name, or a Shared VPC network as")


@pytest.mark.fresh_slice
def test_tpu7x_missing_from_a_project_names_the_allowlist(project, cell):
    project.emulator.compute_faults(hidden_types=["tpu7x-standard-4t"])
    text = str(cell("%tpu_launch tpu7x-8 --project hidden-project --no-setup").error)
    assert text == ("no zone of hidden-project offers tpu7x-standard-4t (tpu7x-8) through Compute Engine: Google "
                    "offers TPU7x to allowlisted projects (ask your account team to add this one)"), text


def test_a_slow_first_boot_is_waited_for_until_compute_engine_says_the_vm_is_gone(isolated_home):
    """A host that does not answer SSH at all (a first boot of minutes) is waited for far past the
    connect wait, and Compute Engine is asked between tries: a VM gone ends the wait at once."""
    from tpunb.provision import ssh
    from tpunb.registry import HostRecord
    from tpunb.transport import keys

    key, _ = keys.default_key()
    record = SliceRecord(name="booting", accelerator="v6e-4", backend="gcp", state="running",
                         spec={"user": "tpunb", "key": str(key)}, hosts=[HostRecord(0, "127.0.0.1:9")])
    asked = []

    def gone() -> str | None:
        asked.append(time.monotonic())
        return "its VM booting is TERMINATED" if len(asked) == 2 else None

    started = time.monotonic()
    with pytest.raises(ProvisionError, match=r"^booting's hosts will not answer: its VM booting is TERMINATED$"):
        ssh.connect_hosts(record, Registry(isolated_home / "registry.db"), 0.0, gone, boot_wait=900.0)
    assert len(asked) == 2 and asked[0] - started >= 1.0  # retried past the connect wait (0 s), then asked again


# -- the metadata server's address ------------------------------------------------------------------

class _Metadata(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        data = b"TPU_WORKER_ID: '3'\n" if self.path.endswith("/tpu-env") and \
            self.headers.get("Metadata-Flavor") == "Google" else b""
        self.send_response(200 if data else 404)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


@pytest.mark.parametrize("variable", ["GCE_METADATA_HOST", "GCE_METADATA_IP"])
def test_either_spelling_of_the_metadata_servers_address_is_read(monkeypatch, variable):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Metadata)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        for name in ("GCE_METADATA_HOST", "GCE_METADATA_IP"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv(variable, f"127.0.0.1:{server.server_address[1]}")
        assert jax_start.tpu_env()["TPU_WORKER_ID"] == "3"
        from tpunb.host.standalone import idle

        assert idle.metadata_host() == f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
