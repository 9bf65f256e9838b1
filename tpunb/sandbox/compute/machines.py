"""The TPU machine types the Compute Engine stand-in offers (machine_types.json beside this file):
what one VM of each holds, where it is offered, and the Python of the image its VMs boot. The
stand-in reads its own copy of Google's facts, not the gcp backend's: a mistake in the backend's
data then shows as a launch the sandbox refuses, as Google would."""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

MACHINES_PATH = Path(__file__).with_name("machine_types.json")


@dataclass(frozen=True)
class MachineType:
    """A Compute Engine TPU machine type: what one VM holds, and where it is offered."""

    name: str
    generation: str
    chips: int
    jax_devices: int  # TPU7x shows each chip as two JAX devices
    topology: str  # the slice one VM of it makes alone
    zones: tuple[str, ...]
    python: str  # the system Python of the image its VMs boot


@functools.lru_cache(maxsize=1)
def machine_types() -> dict[str, MachineType]:
    """Every TPU machine type the stand-in offers, by name."""
    with open(MACHINES_PATH, encoding="utf-8") as f:
        table = json.load(f)["machine_types"]
    return {name: MachineType(name, m["generation"], m["chips"], m["jax_devices"], m["topology"], tuple(m["zones"]),
                              m["python"]) for name, m in table.items()}


def machine_type(name: str) -> MachineType:
    """A machine type by name (KeyError when the stand-in has none: its callers answer Google's 400)."""
    return machine_types()[name]


def compute_zones() -> list[str]:
    """Every zone where some TPU machine type is offered."""
    return sorted({z for m in machine_types().values() for z in m.zones})


def machine_types_in(zone: str) -> list[MachineType]:
    return [m for m in machine_types().values() if zone in m.zones]
