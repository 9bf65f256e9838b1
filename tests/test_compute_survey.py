"""Finding tpunb's Compute Engine resources after the registry is gone (Colab's reset): instances by
label, MIGs, templates and workload policies by the marker in their description, a BULK MIG still
waiting for capacity too, in every zone at once; %tpu_status shows them as orphans, %tpu_down NAME
deletes them, and a template and policy whose MIG is gone (the idle watchdog deletes only the MIG)
go with the next survey. No host environments: the resources are made with tpunb's own bodies."""
from __future__ import annotations

import pytest

from tests.compute_fixture import Google, cloud, made, sandbox  # noqa: F401 - cloud is a fixture
from tests.conftest import wait_for
from tpunb import catalog
from tpunb.provision.gcp.compute import clients, found
from tpunb.registry import Registry, SliceRecord

ZONE, WAITING_ZONE, V6E_ZONE = "us-central1-c", "us-central1-ai1a", "us-east5-b"


@pytest.fixture(scope="module")
def box():
    yield from sandbox(3, 0.1, 0.05, 0.1)


def orphans(cell, ip) -> dict[str, dict]:
    cell("%tpu_status")
    frame = ip.user_ns["_"]
    return {row["slice"]: dict(row) for _, row in frame.iterrows() if str(row["state"]).startswith("ORPHAN")}


def test_a_reset_kernel_finds_instances_and_migs_in_every_zone_and_downs_them(cloud, cell, ip):
    google = Google(cloud)
    cloud.emulator.faults(no_capacity=[WAITING_ZONE])
    made(google, "lost", "tpu7x-16", ZONE)  # 2 VMs
    made(google, "alone", "v6e-8", V6E_ZONE)  # one instance
    made(google, "queued", "tpu7x-16", WAITING_ZONE)  # a BULK MIG with no VMs yet
    wait_for(lambda: google.migs.get(project=cloud.project, zone=ZONE, instance_group_manager="lost").status.is_stable,
             10, "the MIG to be stable")
    found = orphans(cell, ip)
    assert set(found) == {"lost", "alone", "queued"}, found
    assert (found["lost"]["accelerator"], found["lost"]["cloud_state"]) == ("tpu7x-16", "READY")
    assert found["alone"]["accelerator"] == "v6e-8" and found["alone"]["usd_per_hour"] > 0
    assert found["queued"]["cloud_state"] == "WAITING_FOR_RESOURCES"
    assert "BULK MIG waiting for capacity" in found["queued"]["state"] and "%tpu_down queued" in found["queued"]["state"]
    assert found["lost"]["address"] == f"{cloud.project}/{ZONE}"
    for name in ("lost", "alone", "queued"):
        down = cell(f"%tpu_down {name}")
        assert down.error is None, down.shown
    for zone in (ZONE, WAITING_ZONE, V6E_ZONE):
        assert all(not v for v in google.everything(zone).values()), google.everything(zone)
    assert orphans(cell, ip) == {}


def test_leftovers_without_their_mig_go_with_the_next_survey_or_tpu_down(cloud, cell, ip, isolated_home):
    google = Google(cloud)
    made(google, "idle", "tpu7x-16", ZONE)
    Registry(isolated_home / "registry.db").save_slice(SliceRecord(  # this kernel's slice, its MIG up
        name="idle", accelerator="tpu7x-16", backend="gcp", state="running",
        spec={"api": "compute", "project": cloud.project, "zone": ZONE, "vms": 2}))
    google.migs.delete_unary(project=cloud.project, zone=ZONE, instance_group_manager="idle")  # the idle watchdog
    wait_for(lambda: not google.everything(ZONE)["migs"], 10, "the MIG to go")
    assert google.everything(ZONE)["templates"] == ["idle-tpunb-t"]
    made(google, "half", "tpu7x-16", ZONE, mig=False)  # a kernel that died before its MIG: unknown here, new

    found = orphans(cell, ip)
    assert google.everything(ZONE)["templates"] == ["half-tpunb-t"]  # idle's leftovers went with the survey
    assert google.everything(ZONE)["policies"] == ["half-tpunb-wp"]
    assert set(found) == {"half"} and found["half"]["cloud_state"] == "LEFTOVER"
    assert "instance template and workload policy without a MIG" in found["half"]["state"]
    assert cell("%tpu_down half").error is None and cell("%tpu_down idle").error is None
    assert all(not v for v in google.everything(ZONE).values())


def test_leftovers_no_registry_knows_go_once_no_launch_can_be_making_them(cloud, cell, ip, monkeypatch):
    google = Google(cloud)
    made(google, "old", "tpu7x-16", ZONE, mig=False)
    assert set(orphans(cell, ip)) == {"old"}  # young: maybe another kernel's launch between policy and MIG
    monkeypatch.setattr(found, "LEFTOVER_AGE", 0.0)  # as if LEFTOVER_AGE had passed
    assert orphans(cell, ip) == {} and all(not v for v in google.everything(ZONE).values())


def test_a_status_view_reads_its_recorded_slices_states_from_the_survey(cloud, cell, ip, isolated_home, monkeypatch):
    """The survey already lists every tpunb MIG and instance: a recorded slice's state is read there,
    not asked of Compute Engine once more per slice (a status view then waits for one round)."""
    google = Google(cloud)
    made(google, "kept", "tpu7x-16", ZONE)  # 2 VMs
    made(google, "single", "v6e-8", V6E_ZONE)  # one instance
    wait_for(lambda: google.migs.get(project=cloud.project, zone=ZONE, instance_group_manager="kept").status.is_stable,
             10, "the MIG to be stable")
    reg = Registry(isolated_home / "registry.db")
    for name, accelerator, zone, vms in (("kept", "tpu7x-16", ZONE, 2), ("single", "v6e-8", V6E_ZONE, 1)):
        reg.save_slice(SliceRecord(name=name, accelerator=accelerator, backend="gcp", state="running",
                                   spec={"api": "compute", "project": cloud.project, "zone": zone, "vms": vms}))
    asked = []
    c = clients.clients()
    monkeypatch.setattr(c.migs, "get", lambda **kw: asked.append(("MIG", kw)))
    monkeypatch.setattr(c.instances, "get", lambda **kw: asked.append(("instance", kw)))
    cell("%tpu_status")
    shown = {row["slice"]: row["cloud_state"] for _, row in ip.user_ns["_"].iterrows()}
    assert shown == {"kept": "READY", "single": "RUNNING"} and asked == [], (shown, asked)
    monkeypatch.undo()
    assert cell("%tpu_down kept").error is None and cell("%tpu_down single").error is None
    assert all(not v for v in google.everything(ZONE).values()) and not google.everything(V6E_ZONE)["instances"]
