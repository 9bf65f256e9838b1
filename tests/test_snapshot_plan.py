"""Whether a snapshot fits a slice, decided from its manifest before anything loads: the mesh
resized to the new device count, each dimension still divisible, HBM per chip (the planner's
reserve), per-host values on another host count."""
from __future__ import annotations

import pytest

from tpunb import catalog
from tpunb.errors import SnapshotError
from tpunb.snapshot.plan import plan_restore, resize_mesh


def manifest(shape, spec, axes=("x",), sizes=(8,), hosts=2, same=True, dtype="float32", itemsize=4) -> dict:
    nbytes = itemsize
    for n in shape:
        nbytes *= n
    return {"hosts": hosts, "devices": 8,
            "names": {"w": {"kind": "array", "arrays": ["w__0"], "same_on_all_hosts": True},
                      "step": {"kind": "value", "arrays": [], "same_on_all_hosts": same}},
            "arrays": {"w__0": {"shape": list(shape), "dtype": dtype, "nbytes": nbytes,
                                "sharding": {"kind": "named", "axes": list(axes), "sizes": list(sizes),
                                             "spec": list(spec), "axis_types": None}}}}


def test_the_first_axis_takes_up_the_change_in_devices():
    assert resize_mesh(["data", "model"], [2, 4], 16) == [4, 4]
    assert resize_mesh(["data", "model"], [2, 4], 4) == [1, 4]
    assert resize_mesh(["data", "model"], [2, 4], 2) is None
    plan = plan_restore(manifest((64, 16), ["x"]), None, hosts=2, devices=4)
    assert plan.meshes[plan.array_mesh["w__0"]]["sizes"] == [4]
    assert plan.sources == {0: {"w": 0, "step": 0}, 1: {"w": 1, "step": 1}}


def test_a_spec_that_does_not_divide_is_one_line_naming_variable_axis_and_sizes():
    with pytest.raises(SnapshotError) as caught:
        plan_restore(manifest((4, 10), [None, ["data", "model"]], axes=("data", "model"), sizes=(2, 2)), None,
                     hosts=1, devices=8)
    assert str(caught.value) == ("w: dimension 1 (size 10) is split over mesh axis 'data', 'model' of size 8 on 8 "
                                 "devices, which does not divide it: restore onto a slice where 10 is a multiple of "
                                 "that axis (the saved mesh was ('data': 2, 'model': 2))")
    with pytest.raises(SnapshotError, match=r"^w: its mesh \('data': 2, 'model': 4\) cannot be laid over 2 devices"):
        plan_restore(manifest((8, 8), ["data", "model"], axes=("data", "model"), sizes=(2, 4)), None, hosts=1, devices=2)


def test_hbm_per_chip_is_checked_against_the_catalog_before_anything_loads():
    v5e = catalog.lookup("v5litepod-4")  # 16 GiB per chip, 4 chips
    bf16 = manifest((4 * 2**30, 4), ["x"], itemsize=2)  # 32 GiB of bf16, P('x') over 4 chips: 8 GiB each
    plan = plan_restore(bf16, ["w"], hosts=1, devices=4, accelerator=v5e)
    assert plan.per_chip_bytes == 8 * 2**30
    too_big = manifest((4 * 2**30, 16), ["x"], itemsize=2)  # 128 GiB: 32 GiB per chip
    with pytest.raises(SnapshotError) as caught:
        plan_restore(too_big, ["w"], hosts=1, devices=4, accelerator=v5e)
    assert str(caught.value) == ("restoring w needs 32.0 GiB of HBM per chip, and v5litepod-4 has 14.4 GiB usable per "
                                 "chip (after the planner's 10% reserve): restore onto a slice with more chips or "
                                 "more HBM per chip (%tpu_plan says which), or restore fewer names")
    replicated = manifest((2**30, 16), [], itemsize=1)  # 16 GiB whole on every chip
    with pytest.raises(SnapshotError, match="needs 16.0 GiB of HBM per chip"):
        plan_restore(replicated, ["w"], hosts=1, devices=4, accelerator=v5e)
    with pytest.raises(SnapshotError, match="needs 8.0 GiB of HBM per chip, and this slice has 4.0 GiB"):
        plan_restore(bf16, ["w"], hosts=1, devices=4, hbm_limit=4 * 2**30)  # what a real TPU host reports


def test_per_host_values_on_another_host_count():
    assert plan_restore(manifest((8,), ["x"], same=True), ["step"], hosts=4, devices=16).sources[3] == {"step": 0}
    with pytest.raises(SnapshotError, match="^step differed between the 2 hosts it was saved from, and this slice "
                                            "has 1 host: restore it onto 2 hosts, or restore the other names alone$"):
        plan_restore(manifest((8,), ["x"], same=False), None, hosts=1, devices=4)
    with pytest.raises(SnapshotError, match=r"^nope is not in this snapshot \(it holds step, w\)$"):
        plan_restore(manifest((8,), ["x"]), ["nope"], hosts=2, devices=8)


def test_cloud_slices_need_a_bucket_named_once(monkeypatch):
    from tpunb.errors import UsageError
    from tpunb.snapshot import places as store

    monkeypatch.delenv("TPUNB_BUCKET", raising=False)
    with pytest.raises(UsageError, match="^a cloud slice snapshots to Cloud Storage: give --to gs://BUCKET/PATH, or "
                                         "name a bucket once with --bucket BUCKET"):
        store.new_uri(True, "pod", None)
    assert store.new_uri(False, "pod", None).startswith(str(store.home() / "pod") + "/")
    monkeypatch.setenv("TPUNB_BUCKET", "from-env")
    assert store.new_uri(True, "pod", None).startswith("gs://from-env/tpunb-snapshots/pod/")
    store.bucket("gs://named-once/")
    assert store.new_uri(True, "pod", None).startswith("gs://named-once/tpunb-snapshots/pod/")
    assert store.new_uri(True, "pod", "gs://b/some/where/") == "gs://b/some/where"
    with pytest.raises(UsageError, match="give gs://BUCKET/PATH"):
        store.new_uri(True, "pod", "gs://b")
