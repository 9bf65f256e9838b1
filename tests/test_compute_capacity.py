"""Where a Compute Engine launch goes and what it does when a zone refuses: the zones come from
Compute Engine's machineTypes.aggregatedList (asked once per session), zones that refuse for
capacity or quota are left with nothing in them and the next one is tried, and every failure is
one line with nothing left behind. The behaviour under test ends before hosts start, so the
backend is driven up to its hosts (no environments are built); the magic's one-line errors are
run in a real shell."""
from __future__ import annotations

import pytest

from tests.compute_fixture import Google, cloud, sandbox  # noqa: F401 - cloud is a fixture
from tpunb import catalog
from tpunb.provision.gcp.compute import VmSpec, first_granted, teardown, zones
from tpunb.provision.gcp.config import CloudOptions
from tpunb.registry import Registry, SliceRecord

V6E_ZONES = ("us-east5-a", "us-east1-d", "europe-west4-a")  # v6e-8: one ct6e-standard-8t
TPU7X_ZONES = ("us-central1-ai1a", "us-central1-c")  # tpu7x-16: a BULK MIG of 2


@pytest.fixture(scope="module")
def box():
    yield from sandbox(2, 0.1, 0.05, 0.05)


def spec(name: str, accelerator: str) -> VmSpec:
    return VmSpec(name, catalog.compute_shape(accelerator), "", "someone@example.com", "tpunb",
                  "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGx0 someone", False)


def launch_until_hosts(box, isolated_home, name: str, accelerator: str, zone_list, **options):
    """The backend's launch up to its hosts, each zone in turn: (hosts, outcomes), and the record."""
    record = SliceRecord(name=name, accelerator=accelerator, backend="gcp", state="creating",
                         spec={"api": "compute", "project": box.project, "zone": zone_list[0]})
    reg = Registry(isolated_home / "registry.db")
    said = []
    made = first_granted(box.project, spec(name, accelerator), list(zone_list), record, reg,
                         lambda text, _: said.append(text), CloudOptions(**options))
    return made, record, said


def nothing_in(google: Google, *zone_list: str) -> bool:
    return all(not v for z in zone_list for v in google.everything(z).values())


def test_zones_are_compute_engines_answer_asked_once_per_session(cloud, cell):
    calls = cloud.emulator.record_compute()
    before = len(calls)
    first = zones.offered("zones-probe", "ct6e-standard-8t")  # a project no other test asked about
    again = zones.offered("zones-probe", "ct6e-standard-8t")
    asked = [c for c in calls[before:] if "aggregated/machineTypes" in c.path]
    assert first == again == tuple(sorted(catalog.compute_shape("v6e-8").zones)) and len(asked) == 1
    run = cell("%tpu_launch tpu7x-16 --name nowhere --zone us-east5-a")
    assert str(run.error) == f"us-east5-a has no tpu7x-standard-4t (tpu7x-16): zones with it: {', '.join(TPU7X_ZONES)}"
    assert "Traceback" not in run.shown and nothing_in(Google(cloud), "us-east5-a")


def test_no_zone_picks_the_configured_one_or_the_nearest_that_has_it(cloud, monkeypatch):
    shape = catalog.compute_shape("tpu7x-16")
    assert zones.choose(cloud.project, shape, None, "us-central1-c") == ["us-central1-c"]
    monkeypatch.setenv("CLOUDSDK_COMPUTE_REGION", "us-central1")
    assert zones.choose(cloud.project, shape, None, "europe-west4-a") == list(TPU7X_ZONES)  # it has no TPU7x
    assert zones.choose(cloud.project, catalog.compute_shape("v6e-8"), "any", None)[:1] == ["us-central1-b"]


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


def test_every_zone_failing_is_one_line_per_zone_then_what_to_try(cloud, cell, isolated_home):
    cloud.emulator.faults(no_capacity=[V6E_ZONES[0], V6E_ZONES[2]], quota="operation", quota_regions=["us-east1"])
    run = cell(f"%tpu_launch v6e-8 --name fo --zone {','.join(V6E_ZONES)}")
    lines = str(run.error).splitlines()
    assert lines[:4] == ["fo was granted nowhere (3 tries):", f"  {V6E_ZONES[0]} v6e-8: no capacity",
                         f"  {V6E_ZONES[1]} v6e-8: quota exceeded", f"  {V6E_ZONES[2]} v6e-8: no capacity"], lines
    assert lines[4].startswith("try: --spot; --flex HOURS") and "quotas?project=" in lines[4] and len(lines) == 5
    assert "Traceback" not in run.shown
    assert nothing_in(Google(cloud), *V6E_ZONES) and Registry(isolated_home / "registry.db").list_slices() == []
