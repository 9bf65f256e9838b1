"""%tpu_doctor against the Cloud TPU API emulator (its faults make the broken setups) and a
slice whose hosts are the emulator's real sshd hosts."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from google.cloud import tpu_v2

from tests.conftest import wait_for
from tests.emulator_fixture import configure, on_sshd
from tpunb import doctor, manager
from tpunb.diagnose import host_checks
from tpunb.errors import NoSliceError, UsageError
from tpunb.provision.gcp.tpu import api

ZONE = "us-central2-b"  # offers v4


@pytest.fixture
def tpu_emulator_options(sshd):
    return on_sshd(sshd)


@pytest.fixture
def cloud(tpu_emulator, monkeypatch):
    configure(monkeypatch, ZONE)
    yield tpu_emulator
    manager.down(all=True)


def rows(report) -> dict[str, tuple[str, str]]:
    return {r.check: (r.status, r.why) for r in report}


@pytest.mark.fresh_slice
def test_a_healthy_cloud_slice_is_ok_on_every_row(cloud, cell, sshd):
    run = cell("%tpu_launch v4-8 --name well")
    assert run.error is None, run.shown
    shown = cell("%tpu_doctor").stdout
    assert shown.startswith("tpu_doctor: slice 'well' (v4-8, gcp); project proj, zone us-central2-b")
    got = rows(doctor())
    assert list(got) == ["credentials", "project", "API enabled", "quota", "zone offers type", "clock skew",
                         "disk space", "package versions", "TPU free", "coordinator port"]
    free = min(shutil.disk_usage(p).free for p in ("/tmp", str(Path.home())))
    expected_disk = "ok" if free >= host_checks.DISK_WARNING_BYTES else "warning"
    assert {k: v[0] for k, v in got.items()} == {**{k: "ok" for k in got}, "disk space": expected_disk}, got
    assert "emulator" in got["credentials"][1] and "1 tpunb node there" in got["API enabled"][1]
    assert got["zone offers type"][1] == "us-central2-b offers v4-8 (runtime tpu-ubuntu2204-base)"
    width = max(map(len, got)) + 2  # the table: one line per row, check and status in columns
    printed = {line[:width].strip(): line[width:].split()[0] for line in shown.splitlines()[1:]}
    assert printed == {k: v[0] for k, v in got.items()} and not any("\n" in why for _, why in got.values())


def test_a_broken_setup_fails_the_rows_that_are_broken(cloud, cell):
    cloud.faults(api_disabled=True)
    shown = cell("%tpu_doctor --accelerator v4-8").stdout
    assert "no slice attached" in shown.splitlines()[0]
    got = rows(doctor(accelerator="v4-8"))
    assert got["credentials"][0] == "ok" and got["project"][0] == "ok"
    assert got["API enabled"][0] == "failed" and "gcloud services enable tpu.googleapis.com" in got["API enabled"][1]
    assert "quota" not in got and "zone offers type" not in got  # they need the API
    assert "clock skew" not in got  # no slice: no host checks
    cloud.clear_faults()
    other = rows(doctor(accelerator="v4-8", zone="us-east5-a"))
    assert other["zone offers type"] == ("failed", "us-east5-a does not offer v4-8: zones with it: us-central2-b "
                                                    "(or --zone any)")


def test_a_queued_request_that_failed_on_quota_is_a_warning(cloud):
    cloud.faults(quota="operation")
    parent = f"projects/proj/locations/{ZONE}"
    node = tpu_v2.Node(accelerator_type="v4-8", runtime_version="tpu-ubuntu2204-base")
    queued = tpu_v2.QueuedResource(tpu=tpu_v2.QueuedResource.Tpu(node_spec=[
        tpu_v2.QueuedResource.Tpu.NodeSpec(parent=parent, node_id="elsewhere", node=node)]))
    api.client().create_queued_resource(parent=parent, queued_resource_id="elsewhere", queued_resource=queued)
    wait_for(lambda: cloud.queued_resources()[0]["state"]["state"] == "FAILED", 10, "the request to fail on quota")
    status, why = rows(doctor())["quota"]
    assert status == "warning" and "queued resource elsewhere failed on quota" in why and "quotas?project=proj" in why
    api.delete("proj", ZONE, "elsewhere")


def test_missing_credentials_and_project_are_failed_rows(monkeypatch):
    monkeypatch.delenv("TPUNB_TPU_API_ENDPOINT", raising=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", "/nonexistent/adc.json")
    got = rows(doctor(accelerator="v4-8"))
    assert got["credentials"][0] == "failed" and "gcloud auth application-default login" in got["credentials"][1]
    assert got["project"][0] == "failed" and "GOOGLE_CLOUD_PROJECT" in got["project"][1]
    assert "API enabled" not in got


@pytest.mark.fresh_slice
def test_host_checks_on_a_local_slice_and_a_full_disk(cell, monkeypatch):
    assert cell("%tpu_launch v4-16 --name here").error is None
    got = rows(doctor())
    assert list(got) == ["clock skew", "disk space", "package versions", "TPU free", "coordinator port"]  # no cloud rows
    assert got["clock skew"][0] == "ok" and got["clock skew"][1].startswith("2 host clocks agree within")
    assert [got[k][0] for k in ("package versions", "TPU free", "coordinator port")] == ["ok"] * 3, got
    monkeypatch.setattr(host_checks, "DISK_FAILED_BYTES", 2**62)  # more than any disk here holds
    status, why = rows(doctor())["disk space"]
    assert status == "failed" and why.startswith("host 0 has ") and "free in home or temp" in why


def test_clock_skew_counts_only_what_the_probe_time_cannot_explain():
    assert host_checks.skew({0: 100.0, 1: 100.2}, 99.9, 100.3) == (0.0, 0, 1)  # within the round trip
    apart, first, last = host_checks.skew({0: 100.0, 1: 103.0, 2: 101.0}, 99.9, 100.4)
    assert (round(apart, 6), first, last) == (2.5, 0, 1)


def test_an_unknown_slice_name_says_which_exist(cell):
    with pytest.raises(NoSliceError, match="no slice named 'ghost'"):
        doctor("ghost")


def test_an_unknown_flag_is_a_one_line_usage_error(cell):
    run = cell("%tpu_doctor --zonez us-east5-a")
    assert isinstance(run.error, UsageError) and "unrecognized arguments: --zonez. Usage: %tpu_doctor" in str(run.error)
    assert "\n" not in str(run.error)
