"""Zones and types from the API: what a zone offers is what the Cloud TPU API lists for it (asked
once a session), the catalog only where the API cannot be asked; tpu7x is for planning only."""
from __future__ import annotations

import pytest

from tpunb import catalog
from tpunb.provision.gcp import apis
from tpunb.errors import ProvisionError, UsageError
from tests.test_cloud import cloud, launch, tpu_emulator_options  # noqa: F401 - fixtures


def type_lists(wire) -> list:
    return [e for e in wire if e.method == "GET" and e.path.endswith("/acceleratorTypes")]


@pytest.mark.fresh_slice
def test_the_api_decides_what_a_zone_offers_and_is_asked_once(cloud, cell, launch):
    cloud.faults(offered={"us-central2-b": ["v4-8"], "us-central2-z": ["v4-8"]})
    wire = cloud.record()
    refused = launch("--name wide --zone us-central2-b")  # v4-16: the catalog says yes, the API no
    assert isinstance(refused.error, ProvisionError) and "\n" not in str(refused.error)
    assert "v4-16 is not offered in us-central2-b (the Cloud TPU API lists the zone's types: it offers v4-8)" \
        in str(refused.error)
    assert not [e for e in wire if e.method == "POST"] and cloud.state()["nodes"] == []
    assert launch("--name newzone --zone us-central2-z", accel="v4-8").error is None  # in no catalog, offered
    assert cell("%tpu_down newzone").error is None
    again = launch("--name wide2 --zone us-central2-b")
    assert isinstance(again.error, ProvisionError)
    assert [e.path.split("/")[5] for e in type_lists(wire)] == ["us-central2-b", "us-central2-z"]  # once per zone


def test_where_the_api_cannot_be_asked_the_catalog_decides(cloud, launch):
    cloud.accounts(permissions={"user@example.com": ["tpu.nodes.*"]})  # no tpu.acceleratortypes.list
    refused = launch("--name far --zone europe-west4-a")
    assert isinstance(refused.error, ProvisionError) and "zones with v4-16: us-central2-b" in str(refused.error)


@pytest.mark.fresh_slice
def test_tpu7x_is_launched_through_compute_engine_only(cloud, cell, ip, launch, monkeypatch):
    monkeypatch.setenv("TPUNB_COMPUTE_API_ENDPOINT", cloud.url)  # its zones are Compute Engine's answer
    table = catalog.table("tpu7x")
    assert all(z == "us-central1-ai1a, us-central1-c" for z in table["zones"])  # Compute Engine's zones
    plan = cell("%tpu_plan llama3-8b --tpu tpu7x").shown
    assert "tpu7x-8" in plan and "planning only" not in plan
    assert apis.no_tpu_api("tpu7x-8") and apis.default_api("tpu7x-8") == "compute"  # none through the Cloud TPU API
    refused = cell("%tpu_launch tpu7x-8 --api tpu")
    assert isinstance(refused.error, UsageError) and "tpu7x-8 is made only through Compute Engine" in str(refused.error)
    elsewhere = cell("%tpu_launch tpu7x-8")  # the zone configured here (us-central2-b) has no TPU7x VMs
    assert "us-central2-b has no tpu7x-standard-4t (tpu7x-8): zones with it: us-central1-ai1a" in str(elsewhere.error)
    from tpunb.server import model

    assert "tpu7x-32" in model.catalog()["accelerators"]  # the sidebar's form offers it


@pytest.mark.fresh_slice
def test_alternatives_and_races_skip_tpu7x_with_a_note(cloud, cell, launch):
    """v5litepod-8 and tpu7x-8 are both one host: the race goes on without tpu7x, and says why."""
    run = launch("--name raced --zone us-central1-a,us-west4-a --alternatives tpu7x-8 --race 2", accel="v5litepod-8")
    assert run.error is None, run.shown
    assert "--alternatives: skipping tpu7x-8, which the Cloud TPU API cannot make" in run.shown
    assert cloud.state()["nodes"][0]["acceleratorType"] == "v5litepod-8"
    assert cell("%tpu_down raced").error is None


@pytest.mark.parametrize("zone", ["us-east1-c", "us-east5-b"])
def test_the_catalog_no_longer_offers_v5e_where_google_does_not(zone):
    with pytest.raises(ProvisionError, match="v5litepod-8 is not offered in zone"):
        catalog.check_zone("v5litepod-8", zone)
