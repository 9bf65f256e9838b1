"""Which Google API makes each generation's slices, and how Compute Engine makes them: the gcp
backend's own data (apis.json beside this file), apart from the catalog of accelerators.

TPU7x is made only through Compute Engine (and GKE); v6e and v5p go through Compute Engine by
default, and the Cloud TPU API with ``--api tpu``; older types only through the Cloud TPU API.
Compute Engine makes a slice as ``vms`` VMs of one TPU machine type (``ComputeShape``).
"""
from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpunb import catalog
from tpunb.errors import UnknownAcceleratorError, UsageError
from tpunb.units import either

APIS_PATH = Path(__file__).with_name("apis.json")
IMAGE_PROJECT = "ubuntu-os-accelerator-images"  # Google's TPU-optimized Ubuntu images (catalog source gce-images)


@functools.lru_cache(maxsize=1)
def _load() -> dict[str, Any]:
    with open(APIS_PATH, encoding="utf-8") as f:
        return json.load(f)


def _of(accelerator: catalog.Accelerator | str) -> tuple[catalog.Accelerator, dict[str, Any]]:
    acc = catalog.lookup(accelerator) if isinstance(accelerator, str) else accelerator
    return acc, _load()["generations"].get(acc.generation, {})


def default_api(accelerator: catalog.Accelerator | str) -> str:
    """The API that makes the type's slices unless --api says: "tpu" (Cloud TPU) or "compute"."""
    return _of(accelerator)[1].get("default_api", "tpu")


def no_tpu_api(accelerator: catalog.Accelerator | str) -> str:
    """Why the Cloud TPU API cannot make the type ("": it can)."""
    return _of(accelerator)[1].get("no_tpu_api", "")


def compute_zones(accelerator: catalog.Accelerator | str) -> tuple[str, ...]:
    """Where Compute Engine offers the type (empty: it does not make it)."""
    return tuple((_of(accelerator)[1].get("compute") or {}).get("zones", ()))


def compute_entry(generation: str) -> dict[str, Any] | None:
    """How Compute Engine makes a generation's slices (apis.json "compute"); None: it does not."""
    return _load()["generations"].get(generation, {}).get("compute")


def check_tpu_api(acc: catalog.Accelerator) -> None:
    """Through the Cloud TPU API: a planning-only type, or one only Compute Engine makes (tpu7x), is
    a one-line UsageError before anything is asked of a cloud."""
    catalog.check_launchable(acc)
    if no_tpu_api(acc):
        raise UsageError(f"{acc.name} is made only through Compute Engine ({no_tpu_api(acc)}): launch it without "
                         "--api tpu")


@dataclass(frozen=True)
class MachineType:
    """A Compute Engine TPU machine type: what one VM holds."""

    name: str
    generation: str
    chips: int
    jax_devices: int  # TPU7x shows each chip as two JAX devices
    topology: str  # the slice one VM of it makes alone


@dataclass(frozen=True)
class ComputeShape:
    """How Compute Engine makes one slice: ``vms`` instances of ``machine_type`` (a MIG whose
    workload policy names ``topology`` when there is more than one)."""

    accelerator: str
    machine_type: str
    vms: int
    chips_per_vm: int
    devices_per_vm: int
    topology: str
    image_family: str
    ubuntu: str
    python: str  # the image's system Python
    disk_type: str
    zones: tuple[str, ...]

    @property
    def multi_host(self) -> bool:
        return self.vms > 1

    @property
    def source_image(self) -> str:
        return f"projects/{IMAGE_PROJECT}/global/images/family/{self.image_family}"


@functools.lru_cache(maxsize=1)
def machine_types() -> dict[str, MachineType]:
    """Every Compute Engine TPU machine type tpunb knows, by name."""
    return {name: MachineType(name, m["generation"], m["chips"], m["jax_devices"], m["topology"])
            for name, m in _load()["compute_machine_types"].items()}


def machine_type(name: str) -> MachineType:
    """A machine type by name; UnknownAcceleratorError (with the known ones) otherwise."""
    found = machine_types().get(name)
    if found is None:
        raise UnknownAcceleratorError(f"unknown TPU machine type {name!r}: Compute Engine's are {', '.join(machine_types())}")
    return found


def compute_shape(accelerator: catalog.Accelerator | str) -> ComputeShape:
    """The machine type and VM count Compute Engine makes ``acc`` with (``tpu7x-32``: 4 VMs of
    ``tpu7x-standard-4t``; ``v6e-8``: one ``ct6e-standard-8t``, ``v6e-16``: 4 of ``ct6e-standard-4t``)."""
    acc, entry = _of(accelerator)
    compute = entry.get("compute")
    if compute is None:
        raise UsageError(f"{acc.name} is made only through the Cloud TPU API: Compute Engine offers TPU7x, v6e and "
                         "v5p; use --api tpu")
    g = catalog.generation(acc.generation)
    size = {g.name(s): s for s in g.sizes}.get(acc.name)  # None: a hypothetical shape
    name = compute["machine_types"].get(str(size))
    if name is None and acc.chips <= machine_type(compute["multi_host_machine_type"]).chips:
        raise UsageError(f"{acc.name} has no Compute Engine machine type (Google documents "
                         f"{either(sorted(set(compute['machine_types'].values())))} for {g.key}); pick a larger size")
    mt = machine_type(name or compute["multi_host_machine_type"])
    return ComputeShape(acc.name, mt.name, math.ceil(acc.chips / mt.chips), mt.chips, mt.jax_devices, acc.topology,
                        compute["image_family"], compute["ubuntu"], compute["python"], compute["disk_type"],
                        tuple(compute["zones"]))
