"""The catalog's Compute Engine data: machine types, VMs per slice, JAX devices per VM, images,
zones and the default API (issue 36). Sources: docs.cloud.google.com/compute/docs/tpus/tpu-machines
(machine types, chips per VM, VMs = chips / 4), tpu/docs/tpu7x (2 JAX devices per chip), the
image families of ubuntu-os-accelerator-images as field reports give them (catalog source gce-images)."""
import pytest

from tpunb.provision.gcp import apis
from tpunb import catalog
from tpunb.errors import UnknownAcceleratorError, UsageError


@pytest.mark.parametrize("name, machine, vms, devices_per_vm, topology", [
    ("tpu7x-32", "tpu7x-standard-4t", 4, 8, "2x2x4"),  # 16 chips, 4 VMs: the slice
    ("tpu7x-8", "tpu7x-standard-4t", 1, 8, "2x2x1"),  # TPU7x's only single-host shape
    ("tpu7x-128", "tpu7x-standard-4t", 16, 8, "4x4x4"),
    ("v6e-1", "ct6e-standard-1t", 1, 1, "1x1"),
    ("v6e-4", "ct6e-standard-4t", 1, 4, "2x2"),
    ("v6e-8", "ct6e-standard-8t", 1, 8, "2x4"),  # one full-host VM, not two half-hosts
    ("v6e-16", "ct6e-standard-4t", 4, 4, "4x4"),
    ("v6e-256", "ct6e-standard-4t", 64, 4, "16x16"),
    ("v5p-8", "ct5p-hightpu-4t", 1, 4, "2x2x1"),
    ("v5p-128", "ct5p-hightpu-4t", 16, 4, "4x4x4"),
])
def test_each_compute_type_has_its_machine_type_vms_and_devices(name, machine, vms, devices_per_vm, topology):
    shape = apis.compute_shape(name)
    assert (shape.machine_type, shape.vms, shape.devices_per_vm, shape.topology) == (machine, vms, devices_per_vm, topology)
    assert shape.vms * shape.chips_per_vm == catalog.lookup(name).chips
    assert shape.multi_host == (vms > 1)
    assert apis.default_api(catalog.lookup(name)) == "compute"


def test_images_are_the_accelerator_images_ubuntu_2204_and_2404_for_tpu7x():
    v6e, tpu7x, v5p = (apis.compute_shape(n) for n in ("v6e-8", "tpu7x-32", "v5p-8"))
    assert v6e.source_image == ("projects/ubuntu-os-accelerator-images/global/images/family/"
                                "ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e")
    assert v5p.image_family == v6e.image_family and (v6e.ubuntu, v6e.python) == ("22.04", "3.10")
    assert (tpu7x.image_family, tpu7x.ubuntu, tpu7x.python) == ("ubuntu-accel-2404-amd64-tpu-tpu7x", "24.04", "3.12")
    assert (v6e.disk_type, tpu7x.disk_type, v5p.disk_type) == ("hyperdisk-balanced", "hyperdisk-balanced", "pd-balanced")


def test_machine_types_hold_the_documented_chips_and_devices():
    table = {m.name: (m.generation, m.chips, m.jax_devices) for m in apis.machine_types().values()}
    assert table == {"tpu7x-standard-4t": ("tpu7x", 4, 8), "ct6e-standard-1t": ("v6e", 1, 1),
                     "ct6e-standard-4t": ("v6e", 4, 4), "ct6e-standard-8t": ("v6e", 8, 8),
                     "ct5p-hightpu-4t": ("v5p", 4, 4)}
    with pytest.raises(UnknownAcceleratorError, match="tpu7x-standard-4t"):
        apis.machine_type("ct5lp-hightpu-4t")  # v5e has no Compute Engine path


def test_zones_per_the_regions_page():
    assert apis.compute_shape("tpu7x-32").zones == ("us-central1-ai1a", "us-central1-c")
    assert "us-east5-a" in apis.compute_shape("v5p-8").zones and "us-central1-b" in apis.compute_shape("v6e-4").zones


def test_the_cloud_tpu_api_stays_the_default_for_older_generations_and_refuses_compute():
    for name in ("v2-8", "v3-8", "v4-8", "v5litepod-8"):
        assert apis.default_api(catalog.lookup(name)) == "tpu"
        with pytest.raises(UsageError, match="only through the Cloud TPU API.*--api tpu"):
            apis.compute_shape(name)


def test_tpu7x_is_made_only_through_compute_engine():
    acc = catalog.lookup("tpu7x-32")
    assert apis.no_tpu_api(acc) and not acc.planning_only and "us-central1-c" in apis.compute_zones(acc)
    assert apis.default_api(acc) == "compute"
    catalog.check_launchable(acc)  # the catalog has no word on APIs: the backend's data has
    with pytest.raises(UsageError, match="^tpu7x-32 is made only through Compute Engine .*: launch it without --api tpu$"):
        apis.check_tpu_api(acc)


def test_a_shape_without_a_documented_machine_type_is_one_line():
    with pytest.raises(UsageError, match="tpu7x-2 has no Compute Engine machine type.*tpu7x-standard-4t"):
        apis.compute_shape("tpu7x-2")


@pytest.mark.parametrize("generation, topology, name", [
    ("tpu7x", "4x4x4", "tpu7x-128"), ("tpu7x", "2x2x4", "tpu7x-32"), ("ironwood", " 2x2x1 ", "tpu7x-8"),
    ("v6e", "2x4", "v6e-8"), ("v5p", "4X4X4", "v5p-128"),
])
def test_topology_names_the_catalog_accelerator(generation, topology, name):
    assert catalog.from_topology(generation, topology).name == name


def test_an_unknown_topology_lists_the_ones_there_are():
    with pytest.raises(UnknownAcceleratorError, match=r"tpu7x has no topology '3x3x3'.*2x2x4"):
        catalog.from_topology("tpu7x", "3x3x3")


def test_the_backends_machine_types_are_what_the_sandbox_offers():
    """The gcp backend's table (apis.json) and the Compute Engine stand-in's own copy of Google's
    (tpunb/sandbox/machine_types.json) agree: a type, a VM's chips, devices and topology, the
    zones and the image's Python; a launch the backend plans is one the sandbox would make."""
    from tpunb.sandbox.compute import machines

    offered = machines.machine_types()
    assert set(offered) == set(apis.machine_types())
    for name, mine in apis.machine_types().items():
        theirs = offered[name]
        assert (mine.generation, mine.chips, mine.jax_devices, mine.topology) == \
            (theirs.generation, theirs.chips, theirs.jax_devices, theirs.topology), name
        shape = apis.compute_shape(catalog.lookup(f"{'v5p' if mine.generation == 'v5p' else mine.generation}-"
                                                  f"{8 if mine.generation != 'v6e' else mine.chips}"))
        assert set(shape.zones) == set(theirs.zones) and shape.python == theirs.python, name
