"""Where a Compute Engine launch goes and what it does when a zone refuses: the zones come from
Compute Engine's machineTypes.aggregatedList (asked once per session), zones that refuse for
capacity or quota are left with nothing in them and the next one is tried, and every failure is
one line with nothing left behind. The behaviour under test ends before hosts start, so the
backend is driven up to its hosts (no environments are built); the magic's one-line errors are
run in a real shell."""
from __future__ import annotations

import dataclasses
import json
import re
import time
from pathlib import Path

import pytest

from tests.compute_fixture import Google, cloud, made, sandbox  # noqa: F401 - cloud is a fixture
from tests.conftest import interrupt_kernel_when
from tpunb.provision.gcp import apis
from tpunb import catalog
from tpunb.errors import CellInterrupted, ProvisionError
from tpunb.provision.gcp.compute import VmSpec, bodies, clients, first_granted, teardown, zones
from tpunb.provision.gcp.config import CloudOptions
from tpunb.registry import Registry, SliceRecord

V6E_ZONES = ("us-east5-a", "us-east1-d", "europe-west4-a")  # v6e-8: one ct6e-standard-8t
TPU7X_ZONES = ("us-central1-ai1a", "us-central1-c")  # tpu7x-16: a BULK MIG of 2


@pytest.fixture(scope="module")
def box():
    yield from sandbox(2, 0.1, 0.05, 0.05)


def spec(name: str, accelerator: str) -> VmSpec:
    return VmSpec(name, apis.compute_shape(accelerator), "", "someone@example.com", "tpunb",
                  "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGx0 someone", False)


def launch_until_hosts(box, isolated_home, name: str, accelerator: str, zone_list, on_state=None, **options):
    """The backend's launch up to its hosts, each zone in turn: (hosts, outcomes), the record and
    the states it said (``on_state(text)`` hears each as it comes)."""
    record = SliceRecord(name=name, accelerator=accelerator, backend="gcp", state="creating",
                         spec={"api": "compute", "project": box.project, "zone": zone_list[0]})
    reg = Registry(isolated_home / "registry.db")
    said = []

    def say(text: str, _: float) -> None:
        said.append(text)
        if on_state:
            on_state(text)

    vm = dataclasses.replace(spec(name, accelerator), flex_hours=options.get("flex"),
                             reservation=options.get("reservation"))
    made = first_granted(box.project, vm, list(zone_list), record, reg, say, CloudOptions(**options))
    return made, record, said


def capacity_comes_when_waiting(box):
    """on_state: the stockout ends once the launch says it waits (the emulator grants it then)."""
    return lambda text: "waiting for capacity" in text and box.emulator.faults(no_capacity=False)


def nothing_in(google: Google, *zone_list: str) -> bool:
    return all(not v for z in zone_list for v in google.everything(z).values())


@pytest.mark.fresh_slice
def test_zones_are_compute_engines_answer_asked_once_per_session(cloud, cell):
    calls = cloud.emulator.record_compute()
    before = len(calls)
    first = zones.offered("zones-probe", "ct6e-standard-8t")  # a project no other test asked about
    again = zones.offered("zones-probe", "ct6e-standard-8t")
    asked = [c for c in calls[before:] if "aggregated/machineTypes" in c.path]
    assert first == again == tuple(sorted(apis.compute_shape("v6e-8").zones)) and len(asked) == 1
    run = cell("%tpu_launch tpu7x-16 --name nowhere --zone us-east5-a")
    assert str(run.error) == f"us-east5-a has no tpu7x-standard-4t (tpu7x-16): zones with it: {', '.join(TPU7X_ZONES)}"
    assert "Traceback" not in run.shown and nothing_in(Google(cloud), "us-east5-a")


def test_no_zone_picks_the_configured_one_or_else_the_nearest_that_have_it(cloud, monkeypatch):
    shape = apis.compute_shape("tpu7x-16")
    assert zones.choose(cloud.project, shape, None, "us-central1-c") == ["us-central1-c"]
    monkeypatch.setenv("CLOUDSDK_COMPUTE_REGION", "us-east5")
    assert zones.choose(cloud.project, shape, None, None) == list(TPU7X_ZONES)  # no zone anywhere, as in Colab
    near = zones.choose(cloud.project, apis.compute_shape("v6e-8"), "any", None)
    assert near[:2] == ["us-east5-a", "us-east5-b"] and near[-1] == "europe-west4-a"


def test_a_stockout_moves_a_mig_to_the_next_zone_leaving_nothing(cloud, isolated_home):
    google = Google(cloud)
    cloud.emulator.faults(no_capacity=[TPU7X_ZONES[0]])  # the BULK MIG there waits: listErrors say why
    (hosts, outcomes), record, said = launch_until_hosts(cloud, isolated_home, "fo", "tpu7x-16", TPU7X_ZONES)
    assert len(hosts) == 2 and record.spec["zone"] == TPU7X_ZONES[1]
    assert [str(o) for o in outcomes] == [f"{TPU7X_ZONES[0]} tpu7x-16: no capacity", f"{TPU7X_ZONES[1]} tpu7x-16: granted"]
    assert "does not have enough resources" in outcomes[0].detail  # what listErrors said
    assert any(s.startswith(f"{TPU7X_ZONES[0]}: 0/2 VMs running") for s in said), said
    first, second = google.everything(TPU7X_ZONES[0]), google.everything(TPU7X_ZONES[1])
    assert first["migs"] == first["instances"] == [] and second["migs"] == ["fo"]
    assert second["templates"] == ["fo-tpunb-t"] and second["policies"] == ["fo-tpunb-wp"]  # one region: the winner's
    assert teardown(cloud.project, TPU7X_ZONES[1], "fo") == "" and nothing_in(google, *TPU7X_ZONES)


@pytest.mark.fresh_slice
def test_every_zone_failing_is_one_line_per_zone_then_what_to_try(cloud, cell, isolated_home):
    cloud.emulator.faults(no_capacity=[V6E_ZONES[0], V6E_ZONES[2]], quota="operation", quota_regions=["us-east1"])
    run = cell(f"%tpu_launch v6e-8 --name fo --zone {','.join(V6E_ZONES)}")
    lines = str(run.error).splitlines()
    assert lines[:4] == ["fo was granted nowhere (3 tries):", f"  {V6E_ZONES[0]} v6e-8: no capacity",
                         f"  {V6E_ZONES[1]} v6e-8: quota exceeded", f"  {V6E_ZONES[2]} v6e-8: no capacity"], lines
    assert lines[4].startswith("try: --spot; --flex HOURS") and "quotas?project=" in lines[4] and len(lines) == 5
    assert "Traceback" not in run.shown
    assert nothing_in(Google(cloud), *V6E_ZONES) and Registry(isolated_home / "registry.db").list_slices() == []


def test_a_flex_start_vm_waits_pending_for_capacity_then_runs(cloud, isolated_home):
    google = Google(cloud)
    cloud.emulator.faults(no_capacity=[V6E_ZONES[0]])
    (hosts, _), _, said = launch_until_hosts(cloud, isolated_home, "flexible", "v6e-4", V6E_ZONES[:1],
                                             capacity_comes_when_waiting(cloud), flex=2.5, timeout=600)
    assert len(hosts) == 1 and "waiting for capacity (flex-start)" in said and said[-1] == "VM RUNNING", said
    vm = google.instances.get(project=cloud.project, zone=V6E_ZONES[0], instance="flexible")
    assert (vm.scheduling.provisioning_model, vm.scheduling.max_run_duration.seconds) == ("FLEX_START", 9000)
    assert vm.scheduling.instance_termination_action == "DELETE"
    assert vm.reservation_affinity.consume_reservation_type == "NO_RESERVATION"
    assert teardown(cloud.project, V6E_ZONES[0], "flexible") == ""


def test_a_flex_start_slice_is_an_empty_bulk_mig_sized_up(cloud, isolated_home):
    google = Google(cloud)
    cloud.emulator.compute_faults(allowlisted=True)  # TPU7x flex-start is behind Google's allowlist
    cloud.emulator.faults(no_capacity=[TPU7X_ZONES[1]])
    try:
        (hosts, _), _, said = launch_until_hosts(cloud, isolated_home, "flexslice", "tpu7x-16", TPU7X_ZONES[1:],
                                                 capacity_comes_when_waiting(cloud), flex=1)
    finally:
        cloud.emulator.compute_faults(allowlisted=False)
    assert len(hosts) == 2 and "creating its flex-start request (the MIG resized)" in said
    assert "waiting for capacity (flex-start): 0/2 VMs" in said, said
    template = google.templates.get(project=cloud.project, region="us-central1", instance_template="flexslice-tpunb-t")
    assert template.properties.scheduling.provisioning_model == "FLEX_START"
    assert template.properties.scheduling.max_run_duration.seconds == 3600
    assert google.migs.get(project=cloud.project, zone=TPU7X_ZONES[1], instance_group_manager="flexslice").target_size == 2
    assert teardown(cloud.project, TPU7X_ZONES[1], "flexslice") == "" and nothing_in(google, TPU7X_ZONES[1])


@pytest.mark.fresh_slice
def test_ctrl_c_while_flex_start_waits_deletes_the_request_and_says_so(cloud, cell, isolated_home):
    google = Google(cloud)
    cloud.emulator.faults(no_capacity=[V6E_ZONES[0]])
    pending = lambda: [i.status for i in google.instances.list(project=cloud.project, zone=V6E_ZONES[0])] == ["PENDING"]
    interrupt_kernel_when(pending, timeout=30)
    run = cell(f"%tpu_launch v6e-4 --flex 2 --zone {V6E_ZONES[0]} --name waiting")  # 8t: fallback.py
    assert isinstance(run.error, CellInterrupted), run.shown
    assert re.fullmatch(r"launch of waiting interrupted after \d+s: its flex-start request( \(it was waiting for "
                        r"capacity\))? was deleted, nothing is left running or waiting", str(run.error)), str(run.error)
    assert nothing_in(google, V6E_ZONES[0]) and Registry(isolated_home / "registry.db").list_slices() == []


@pytest.mark.fresh_slice
def test_a_reservation_is_consumed_by_name_and_an_unknown_one_is_one_line(cloud, cell, isolated_home):
    google = Google(cloud)
    cloud.emulator.compute_faults(reservations={"team-res": {"zone": V6E_ZONES[0]}})
    (hosts, _), _, _ = launch_until_hosts(cloud, isolated_home, "reserved", "v6e-8", V6E_ZONES[:1], reservation="team-res")
    affinity = google.instances.get(project=cloud.project, zone=V6E_ZONES[0], instance="reserved").reservation_affinity
    assert (affinity.consume_reservation_type, affinity.key, list(affinity.values)) == (
        "SPECIFIC_RESERVATION", "compute.googleapis.com/reservation-name", ["team-res"])
    assert len(hosts) == 1 and teardown(cloud.project, V6E_ZONES[0], "reserved") == ""
    run = cell(f"%tpu_launch v6e-8 --reservation other-res --zone {V6E_ZONES[0]} --name elsewhere")
    assert "project sandbox-project has no reservation other-res" in str(run.error) and "\n" not in str(run.error)
    assert "Traceback" not in run.shown and nothing_in(google, V6E_ZONES[0])
    for line, message in [("v6e-8 --flex 0.01", "--flex 0.01: give the hours"), ("v6e-8 --flex 2 --spot", "--flex is its own"),
                          ("v4-8 --reservation r", "--reservation is for Compute Engine")]:
        refused = cell(f"%tpu_launch {line} --zone {V6E_ZONES[0]}")
        assert str(refused.error).startswith(message) and "Traceback" not in refused.shown, (line, refused.shown)


# -- faults: each one line, nothing left behind -------------------------------------------------------

FIXTURES = sorted((Path(__file__).parent / "fixtures" / "compute").glob("*.json"))


def _read(fixture: dict) -> ProvisionError:
    """What tpunb makes of a quoted Compute Engine error, by the path its own calls take."""
    import requests
    from google.api_core import exceptions
    from google.cloud import compute_v1

    if fixture["kind"] == "http":
        response = requests.Response()
        response.status_code, response._content = fixture["http_status"], json.dumps(fixture["body"]).encode()
        response.request = requests.Request("POST", "https://compute.googleapis.com/compute/v1/projects/my-project/"
                                            "zones/us-east5-b/instances").prepare()

        def refused():
            raise exceptions.from_http_response(response)

        call = lambda: clients.call("create the VM", refused)  # noqa: E731
    else:
        operation = compute_v1.Operation.from_json(json.dumps(fixture["body"]), ignore_unknown_fields=False)
        call = lambda: clients.wait("my-project", operation, "create the VM")  # noqa: E731
    with pytest.raises(ProvisionError) as info:
        call()
    return info.value


@pytest.mark.parametrize("path", FIXTURES, ids=[p.stem for p in FIXTURES])
def test_compute_engines_quoted_errors_are_one_line(path):
    fixture = json.loads(path.read_text())
    assert fixture["source"] and fixture["taken"], f"{path.name}: say where it came from"
    error = _read(fixture)
    assert error.reason == fixture["expect"]["reason"] and "\n" not in str(error), str(error)
    assert "/compute/v1/" not in str(error), str(error)  # api_core puts the request URL first: never shown
    assert all(part in str(error) for part in fixture["expect"]["contains"]), str(error)


def refused(cell, line: str) -> str:
    run = cell(f"%tpu_launch {line}")
    assert run.error is not None and "\n" not in str(run.error) and "Traceback" not in run.shown, run.shown
    return str(run.error)


def test_a_quota_refusal_names_the_quota_at_once_and_the_cloud_tpu_pool_where_it_applies(cloud, cell, isolated_home):
    cloud.emulator.faults(quota="operation", quota_regions=["us-east5", "us-central1"])
    vm = refused(cell, f"v6e-8 --zone {V6E_ZONES[0]} --name q1")
    assert "Quota 'TPUS-PER-TPU-FAMILY-per-project-region' exceeded. Limit: 0.0 in region us-east5." in vm
    assert f"iam-admin/quotas?project={cloud.project} or --api tpu: the Cloud TPU API's TPU quota is a separate " \
           "pool" in vm and vm.count("--api tpu") == 1, vm
    started = time.monotonic()  # a BULK MIG keeps trying on quota, its VMs listed all along: no 20-minute wait
    mig = refused(cell, f"tpu7x-16 --zone {TPU7X_ZONES[1]} --name q2")
    assert time.monotonic() - started < 60
    assert mig.startswith("the MIG q2 is over quota for its 2 VMs: quota TPUS-PER-TPU-FAMILY-per-project-region "
                          "(limit 0 in us-central1) exceeded; request more at "), mig
    assert "--api tpu" not in mig  # only Compute Engine makes TPU7x
    v5p = refused(cell, "v5p-16 --zone us-east5-a --name q3")
    assert "quota TPU-V5P-per-project-region (limit 0 in us-east5)" in v5p and v5p.count("or --api tpu") == 1, v5p
    assert nothing_in(Google(cloud), V6E_ZONES[0], TPU7X_ZONES[1], "us-east5-a")
    assert Registry(isolated_home / "registry.db").list_slices() == []


def test_tpu7x_spot_and_flex_start_without_the_allowlist(cloud, cell):
    spot = refused(cell, f"tpu7x-8 --spot --zone {TPU7X_ZONES[1]} --name s1")  # one VM
    assert "SPOT provisioning of tpu7x-standard-4t is restricted by an allowlist" in spot, spot
    flex = refused(cell, f"tpu7x-16 --flex 4 --zone {TPU7X_ZONES[1]} --name s2")  # its MIG is refused after the policy
    assert "FLEX_START provisioning of tpu7x-standard-4t is restricted by an allowlist" in flex, flex
    assert nothing_in(Google(cloud), TPU7X_ZONES[1])


def test_a_topology_the_machine_type_cannot_make_is_one_line_and_leaves_nothing(cloud, isolated_home, monkeypatch):
    shape = dataclasses.replace(apis.compute_shape("tpu7x-16"), topology="2x2x3")  # 12 chips: no whole VMs
    monkeypatch.setattr(apis, "compute_shape", lambda accelerator: shape)  # a catalog that went wrong
    with pytest.raises(ProvisionError) as info:
        launch_until_hosts(cloud, isolated_home, "odd", "tpu7x-16", TPU7X_ZONES[1:])
    assert "accelerator topology 2x2x3 cannot be made of tpu7x-standard-4t VMs" in str(info.value)
    assert "\n" not in str(info.value) and nothing_in(Google(cloud), TPU7X_ZONES[1])


def test_a_deletion_that_fails_halfway_lists_the_gcloud_commands_for_what_is_left(cloud, cell, isolated_home):
    google, zone = Google(cloud), TPU7X_ZONES[1]
    made(google, "stuck", "tpu7x-16", zone)
    Registry(isolated_home / "registry.db").save_slice(SliceRecord(
        name="stuck", accelerator="tpu7x-16", backend="gcp", state="running",
        spec={"api": "compute", "project": cloud.project, "zone": zone, "vms": 2}))
    user = cloud.emulator.accounts()["user"]
    cloud.emulator.accounts(permissions={user: ["*.get", "*.list", "*.create", "compute.*Operations.*",
                                                "compute.instanceGroupManagers.delete"]})  # not templates'
    try:
        down = cell("%tpu_down stuck")
    finally:
        cloud.emulator.accounts(permissions={user: None})
    region, p = catalog.region_of(zone), cloud.project
    assert str(down.error) == (
        f"could not delete all of stuck; still there, delete with: gcloud compute instance-templates delete "
        f"stuck-tpunb-t --region {region} --project {p}; gcloud compute resource-policies delete stuck-tpunb-wp "
        f"--region {region} --project {p}"), str(down.error)
    assert google.everything(zone) == {"instances": [], "migs": [], "templates": ["stuck-tpunb-t"],
                                       "policies": ["stuck-tpunb-wp"]}
    assert cell("%tpu_down stuck").error is None and nothing_in(google, zone)  # the record stayed: %tpu_down again


@pytest.mark.fresh_slice
def test_ctrl_c_while_a_mig_fills_deletes_its_mig_template_and_policy(cloud, cell, isolated_home):
    google, zone = Google(cloud), TPU7X_ZONES[1]
    cloud.emulator.compute_faults(unstable=[zone])  # a stockout with no other zone to try: it waits
    interrupt_kernel_when(lambda: google.everything(zone)["migs"] == ["held"], timeout=30)
    try:
        run = cell(f"%tpu_launch tpu7x-16 --zone {zone} --name held")
    finally:
        cloud.emulator.compute_faults(unstable=False)
    assert isinstance(run.error, CellInterrupted), run.shown
    assert str(run.error) == "launch of held interrupted: what it had created was deleted, nothing is left running"
    assert nothing_in(google, zone) and Registry(isolated_home / "registry.db").list_slices() == []


def test_an_operation_outlasting_the_clients_timeout_is_asked_again_not_a_traceback(cloud, monkeypatch):
    """Compute Engine holds operations.wait up to 2 minutes (zoneOperations.wait's reference page):
    when the client's own timeout comes first, tpunb asks again instead of failing with requests'
    ReadTimeout (a real TPU VM's insert outlasted the old 30 s)."""
    monkeypatch.setattr(clients, "WAIT_SLICE", 0.3)
    cloud.emulator.faults(slow_create=1.0)
    vm = dataclasses.replace(spec("slowvm", "v6e-8"), zone=V6E_ZONES[0])
    c = clients.clients()
    try:
        operation = c.instances.insert_unary(project=cloud.project, zone=vm.zone, instance_resource=bodies.instance(vm))
        clients.wait(cloud.project, operation, "create the VM", deadline=time.monotonic() + 30)
        assert c.instances.get(project=cloud.project, zone=vm.zone, instance="slowvm").status == "RUNNING"
    finally:
        cloud.emulator.faults(slow_create=0)
        assert teardown(cloud.project, vm.zone, "slowvm", vms=1) == ""
