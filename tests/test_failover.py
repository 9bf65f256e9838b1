"""Capacity failover against the Cloud TPU API emulator and its injected faults: zones tried in
order, queued resources raced, types widened; the hosts that win are the emulator's real sshd hosts."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.conftest import interrupt_kernel_when, wait_for
from tests.emulator_fixture import configure, on_sshd
from tpunb import catalog, manager
from tpunb.errors import CellInterrupted, ProvisionError, UsageError
from tpunb.provision.gcp.tpu import api, failover
from tpunb.registry import Registry

# v5p-8 is one host, offered in three zones: a race of all three fits the sshd's four hosts
Z1, Z2, Z3 = catalog.lookup("v5p-8").zones


@pytest.fixture
def tpu_emulator_options(sshd):
    return on_sshd(sshd)


@pytest.fixture
def cloud(tpu_emulator, monkeypatch, isolated_home):
    """A configured project pointed at the emulator; after the test nothing is left in any zone."""
    configure(monkeypatch, Z1)
    yield tpu_emulator
    manager.down(all=True)
    assert tpu_emulator.state()["nodes"] == [] and tpu_emulator.state()["queuedResources"] == []


@pytest.fixture
def launch(cell, sshd):
    return lambda extra: cell(f"%tpu_launch v5p-8 --api tpu --name fo {extra}")  # failover: a Cloud TPU API path


def places(state: dict, kind: str = "nodes") -> list[str]:
    """Where the emulator holds nodes (or queued resources): their zones."""
    return sorted(item["name"].split("/")[3] for item in state[kind])


@pytest.mark.fresh_slice
@pytest.mark.jax
def test_a_stockout_in_the_first_zone_ends_with_a_working_slice_in_the_second(cloud, cell, launch, isolated_home):
    cloud.faults(no_capacity=[Z1])
    run = launch(f"--zone {Z1},{Z2}")
    assert run.error is None, run.shown
    assert f"{Z1} v5p-8: no capacity" in run.stdout and f"{Z2} v5p-8: granted" in run.stdout
    assert places(cloud.state()) == [Z2] and cloud.state()["queuedResources"] == []
    jax = cell("%%on_tpu\nimport jax\njax.device_count()")
    assert jax.error is None and jax.shown.split() == ["4"], jax.shown  # one host, 4 JAX devices
    record = Registry(isolated_home / "registry.db").get_slice("fo")
    assert record.spec["zone"] == Z2 and record.spec["race"] is None  # %tpu_down and --recover find it there


@pytest.mark.fresh_slice
def test_a_race_of_three_zones_leaves_one_node_and_no_other_queued_resource(cloud, cell, launch):
    cloud.faults(no_capacity=[Z1, Z2])  # both wait for capacity while the third is granted
    run = launch(f"--zone {Z1},{Z2},{Z3} --race 3")
    assert run.error is None, run.shown
    assert f"{Z3} v5p-8: granted" in run.stdout
    assert f"{Z1} v5p-8: WAITING_FOR_RESOURCES, deleted" in run.stdout  # the launch line says each zone's fate
    state = cloud.state()
    assert places(state) == [Z3] and places(state, "queuedResources") == [Z3]  # the winner's own
    assert cell("%%on_tpu\n6 * 7").shown.count("42") == 1


@pytest.mark.fresh_slice
def test_a_race_where_every_zone_is_granted_keeps_only_the_first(cloud, cell, launch):
    run = launch(f"--zone {Z1},{Z2},{Z3} --race 3")
    assert run.error is None, run.shown
    state = cloud.state()
    assert len(state["nodes"]) == 1 and places(state) == places(state, "queuedResources")


def test_interrupting_a_race_deletes_every_queued_resource(cloud, launch, isolated_home):
    cloud.faults(no_capacity=True)  # all three wait: the press lands mid-race
    waiting = lambda: [q["state"]["state"] for q in cloud.state()["queuedResources"]] == ["WAITING_FOR_RESOURCES"] * 3
    interrupt_kernel_when(waiting, timeout=30)
    run = launch(f"--zone {Z1},{Z2},{Z3} --race 3")
    assert isinstance(run.error, CellInterrupted), run.shown
    assert "nothing is left running" in str(run.error)
    state = cloud.state()  # deleted before the cell ended, not later
    assert state["nodes"] == [] and state["queuedResources"] == []
    assert Registry(isolated_home / "registry.db").list_slices() == []


def test_a_ctrl_c_during_a_create_call_waits_for_the_call_then_is_raised():
    """Cut in the middle, a create call leaves the launch not knowing whether the node exists (the
    API may make it after the cleanup looked): the press is held until the call returns."""
    from tpunb.provision import interrupts

    made = []

    def create():
        os.kill(os.getpid(), signal.SIGINT)  # the user's press, while the request is on its way
        made.append("node")  # the API made it
        return "operation"

    with pytest.raises(KeyboardInterrupt):
        interrupts.whole(create)
    assert made == ["node"]
    assert interrupts.whole(lambda: "operation") == "operation"  # no press: the call's answer
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # Python's own handler again


def test_a_ctrl_c_as_a_zone_is_granted_deletes_that_node_too(cloud, launch, monkeypatch, isolated_home):
    """A press that lands while the winner is announced (after the search took it out of its list of
    tries in flight, before it returned it) used to leave that node running, deleted by nobody."""
    cloud.faults(no_capacity=[Z1])
    said = failover.Search._say

    def say(self, outcome):
        said(self, outcome)
        if outcome.kind == "granted":
            os.kill(os.getpid(), signal.SIGINT)  # the user's press, as the line says "granted"

    monkeypatch.setattr(failover.Search, "_say", say)
    run = launch(f"--zone {Z1},{Z2}")
    assert isinstance(run.error, CellInterrupted), run.shown
    assert "nothing is left running" in str(run.error)
    state = cloud.state()  # deleted before the cell ended
    assert state["nodes"] == [] and state["queuedResources"] == []
    assert Registry(isolated_home / "registry.db").list_slices() == []


def test_a_ctrl_c_while_the_granted_nodes_hosts_are_read_deletes_it(cloud, launch, monkeypatch, isolated_home):
    """The search returned its node; the launch is reading the node's hosts when the press lands:
    that node goes, not only the requests still in flight."""
    import tpunb.provision.gcp.tpu as handler

    read = handler.host_records

    def host_records(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)  # the user's press, as the hosts are read
        return read(*args, **kwargs)

    monkeypatch.setattr(handler, "host_records", host_records)
    run = launch(f"--zone {Z1}")
    assert isinstance(run.error, CellInterrupted), run.shown
    assert "nothing is left running" in str(run.error)
    state = cloud.state()
    assert state["nodes"] == [] and state["queuedResources"] == []
    assert Registry(isolated_home / "registry.db").list_slices() == []


@pytest.mark.fresh_slice
def test_every_zone_failing_gives_one_line_per_zone_then_what_to_try(cloud, sshd, isolated_home):
    cloud.faults(no_capacity=[Z1], quota="operation", quota_regions=[catalog.region_of(Z2)], permission_denied=[Z3])
    with pytest.raises(ProvisionError) as info:
        manager.launch("v5p-8", name="nowhere", backend="gcp", zone=[Z1, Z2, Z3], api="tpu")
    lines = str(info.value).splitlines()
    assert lines[0] == "nowhere was granted nowhere (3 tries):"
    assert lines[1:4] == [f"  {Z1} v5p-8: no capacity", f"  {Z2} v5p-8: quota exceeded",
                          f"  {Z3} v5p-8: permission denied"]
    assert len(lines) == 5 and lines[4].startswith("try: --queued --race 3 ") and "quota" in lines[4]
    assert info.value.reason == "failover"
    assert cloud.state()["nodes"] == [] and Registry(isolated_home / "registry.db").list_slices() == []


def test_alternatives_widen_the_search_to_another_type_with_the_same_hosts(tpu_emulator):
    """v6e-16 is out of capacity where it is offered; v5litepod-16 (also 4 hosts) is granted."""
    tpu_emulator.faults(no_capacity=["us-central1-b"])
    v6e = catalog.lookup("v6e-16")
    wanted = failover.candidates(v6e, ["us-central1-b", "us-central1-a"], "v5litepod-16")
    assert [str(c) for c in wanted] == ["us-central1-b v6e-16", "us-central1-a v5litepod-16"]
    spec = api.NodeSpec(name="wide", accelerator="v6e-16", project="proj", zone="us-central1-b")
    search = failover.Search(spec, wanted)
    info, made = search.run()
    assert (info.accelerator, info.zone, made.zone) == ("v5litepod-16", "us-central1-a", "us-central1-a")
    assert search.summary() == "us-central1-b v6e-16: no capacity; us-central1-a v5litepod-16: granted"
    assert api.delete("proj", "us-central1-a", "wide") is True
    with pytest.raises(UsageError, match="has 1 host, v6e-16 has 4"):
        failover.candidates(v6e, ["us-central1-b"], "v6e-8")
    with pytest.raises(ProvisionError, match="v6e-16 or v5litepod-16 is offered in none of us-central2-b, "
                                             "asia-east1-c: zones with v6e-16: us-central1-b, "):
        failover.candidates(v6e, ["us-central2-b", "asia-east1-c"], "v5litepod-16")


def test_an_exhausted_regional_quota_skips_the_regions_other_zones(tpu_emulator):
    """Quotas are per region (docs/cloud-facts.md): us-east5-b is not asked once us-east5-a said so."""
    tpu_emulator.faults(quota="http", quota_regions=["us-east5"], permission_denied=["us-east5-b"])
    wanted = failover.candidates(catalog.lookup("v6e-16"), ["us-east5-a", "us-east5-b", "us-central1-b"], None)
    search = failover.Search(api.NodeSpec(name="reg", accelerator="v6e-16", project="proj", zone="us-east5-a"), wanted)
    info, _ = search.run()
    assert info.zone == "us-central1-b"
    assert search.summary() == ("us-east5-a v6e-16: quota exceeded; us-east5-b v6e-16: not tried: the v6e quota of "
                                "us-east5 is exhausted; us-central1-b v6e-16: granted")
    assert api.delete("proj", "us-central1-b", "reg") is True


def test_spot_queued_requests_fail_over_one_zone_at_a_time(tpu_emulator):
    """Without --race a queued request waits its --timeout in each zone, then is deleted."""
    tpu_emulator.faults(no_capacity=[Z1])
    spec = api.NodeSpec(name="sq", accelerator="v5p-8", project="proj", zone=Z1, spot=True, queued=True)
    search = failover.Search(spec, failover.candidates(catalog.lookup("v5p-8"), [Z1, Z2], None), timeout=2.0)
    info, made = search.run()
    assert (info.zone, info.spot, made.queued) == (Z2, True, True)
    assert search.summary() == f"{Z1} v5p-8: no capacity came free before --timeout; {Z2} v5p-8: granted"
    assert places(tpu_emulator.state(), "queuedResources") == [Z2]
    assert api.delete("proj", Z2, "sq") is True


def test_zone_any_lists_every_zone_of_the_type_nearest_first(monkeypatch):
    monkeypatch.setenv("CLOUDSDK_COMPUTE_REGION", "us-east5")
    v6e = catalog.lookup("v6e-16")
    near = failover.zones(v6e, "any")
    assert sorted(near) == sorted(v6e.zones) and near[:2] == ["us-east5-a", "us-east5-b"]
    assert near.index("us-east1-d") < near.index("europe-west4-a")  # same continent before others
    assert failover.zones(v6e, f"{Z2}, {Z1},{Z2}") == [Z2, Z1]


def test_a_project_wide_failure_stops_at_the_first_zone(tpu_emulator):
    tpu_emulator.faults(api_disabled=True)
    spec = api.NodeSpec(name="off", accelerator="v5p-8", project="proj", zone=Z1)
    with pytest.raises(ProvisionError, match="gcloud services enable tpu.googleapis.com") as info:
        failover.Search(spec, failover.candidates(catalog.lookup("v5p-8"), [Z1, Z2], None)).run()
    assert "\n" not in str(info.value)


@pytest.mark.fresh_slice
def test_a_kernel_killed_mid_race_leaves_what_tpu_down_deletes_in_every_zone(cloud, isolated_home):
    """SIGKILL gives the launching kernel no chance to clean up: its record names every zone it tried."""
    cloud.faults(no_capacity=True)
    script = ("import tpunb\n"
              f"tpunb.launch('v5p-8', name='cut', backend='gcp', zone={[Z1, Z2, Z3]!r}, race=3, python='python3', api='tpu')\n")
    kernel = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: len(cloud.state()["queuedResources"]) == 3, 60, "the race to wait in three zones")
    finally:
        kernel.kill()
        kernel.wait()
    assert places(cloud.state(), "queuedResources") == sorted([Z1, Z2, Z3])  # the dead kernel left them
    assert manager.down("cut") == ["cut"]
    assert cloud.state()["queuedResources"] == [] and Registry(isolated_home / "registry.db").list_slices() == []


@pytest.mark.fresh_slice
def test_zone_any_with_one_zone_offering_the_type_launches_there(cloud, cell, sshd):
    run = cell("%tpu_launch v4-8 --name only --zone any")
    assert run.error is None, run.shown
    assert "in proj/us-central2-b (backend gcp)" in run.stdout and places(cloud.state()) == ["us-central2-b"]


@pytest.mark.parametrize("flags, expected", [
    ("--race 0", "--race takes how many zones to wait in at once, e.g. --race 3, not '0'"),
    ("--zone us-central1-a --alternatives v5p-16", "--alternatives v5p-16 has 2 hosts, v5p-8 has 1"),
])
@pytest.mark.fresh_slice
def test_bad_failover_flags_are_one_line(cloud, cell, flags, expected):
    run = cell(f"%tpu_launch v5p-8 --api tpu --backend gcp {flags}")
    assert isinstance(run.error, UsageError) and expected in str(run.error) and "\n" not in str(run.error)
    assert cloud.state()["nodes"] == []
