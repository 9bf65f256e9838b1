"""Whether a snapshot fits the slice it is restored onto, decided before anything loads.

Each saved mesh keeps its axis names; its first axis takes up the change in device count (the
other axes keep their sizes), as a data-parallel axis usually does. Every array keeps its
PartitionSpec on that mesh, so each dimension must still divide evenly, and the arrays must fit
in the chips' HBM with the planner's reserve (``tpunb.plan``'s ``hbm_reserve``). Per-host values go
back to the host of the same index; on another host count only a value that was the same on
every host can go everywhere.
"""
from __future__ import annotations

import dataclasses
import inspect
import math

from tpunb.errors import SnapshotError
from tpunb.units import format_bytes


def hbm_reserve() -> float:
    """The share of HBM the planner leaves for XLA's scratch (``tpunb.plan.plan``'s default)."""
    from tpunb.plan import plan

    return float(inspect.signature(plan).parameters["hbm_reserve"].default)


@dataclasses.dataclass
class RestorePlan:
    """What every host loads: per name its array keys, per host where its value comes from."""

    names: list[str]
    arrays: dict[str, list[str]]  # name -> keys of its global arrays
    sources: dict[int, dict[str, int]]  # host -> name -> the saved host whose value it takes
    meshes: dict[str, dict]  # mesh id -> {"axes": [...], "sizes": [...]}
    array_mesh: dict[str, str]  # array key -> mesh id
    per_chip_bytes: int = 0
    notes: list[str] = dataclasses.field(default_factory=list)


def resize_mesh(axes: list[str], sizes: list[int], devices: int) -> list[int] | None:
    """The saved mesh on ``devices`` devices: the first axis absorbs the change; None if it cannot."""
    rest = math.prod(sizes[1:])
    if devices % rest:
        return None
    return [devices // rest, *sizes[1:]]


def _shards(spec_entry, sizes: dict[str, int]) -> tuple[int, list[str]]:
    names = [] if spec_entry is None else ([spec_entry] if isinstance(spec_entry, str) else list(spec_entry))
    return math.prod(sizes[n] for n in names), names


def plan_restore(manifest: dict, names: list[str] | None, hosts: int, devices: int | None,
                 accelerator=None, hbm_limit: int | None = None) -> RestorePlan:
    """The plan, or one SnapshotError naming the first thing that does not fit (nothing loaded yet).
    ``accelerator``: the new slice's catalog entry (for HBM per chip); ``hbm_limit``: bytes per
    device the hosts reported (a real TPU's), when they did."""
    saved = manifest.get("names", {})
    chosen = list(saved) if not names else list(names)
    unknown = [n for n in chosen if n not in saved]
    if unknown:
        raise SnapshotError(f"{', '.join(unknown)} {'is' if len(unknown) == 1 else 'are'} not in this snapshot "
                            f"(it holds {', '.join(sorted(saved)) or 'nothing'})")
    plan = RestorePlan(chosen, {}, {h: {} for h in range(hosts)}, {}, {})
    saved_hosts = int(manifest.get("hosts") or 1)
    for name in chosen:
        info = saved[name]
        if saved_hosts == hosts:
            for h in range(hosts):
                plan.sources[h][name] = h
        elif info.get("same_on_all_hosts"):
            for h in range(hosts):
                plan.sources[h][name] = 0
        else:
            raise SnapshotError(f"{name} differed between the {saved_hosts} hosts it was saved from, and this slice "
                                f"has {hosts} host{'s' if hosts != 1 else ''}: restore it onto {saved_hosts} hosts, "
                                "or restore the other names alone")
        plan.arrays[name] = list(info.get("arrays", []))
    per_device = 0.0
    for name in chosen:
        for key in plan.arrays[name]:
            meta = manifest["arrays"][key]
            per_device += _place(plan, name, key, meta, devices)
    _check_hbm(plan, per_device, accelerator, hbm_limit)
    return plan


def _place(plan: RestorePlan, name: str, key: str, meta: dict, devices: int | None) -> float:
    """Put one array on its resized mesh (raising if its spec cannot fit); its bytes per device."""
    if devices is None:
        raise SnapshotError(f"{name} holds jax.Arrays, and the hosts of this slice have no JAX: install jax there")
    sharding = meta["sharding"]
    if sharding["kind"] != "named":
        plan.meshes.setdefault("flat", {"axes": ["devices"], "sizes": [devices]})
        plan.array_mesh[key] = "flat"
        return float(meta["nbytes"])  # replicated (or on one device): whole on a device
    axes, old = list(sharding["axes"]), [int(s) for s in sharding["sizes"]]
    new = resize_mesh(axes, old, devices)
    where = f"{name}{_leaf(key)}"
    if new is None:
        others = ", ".join(f"'{a}'={s}" for a, s in zip(axes[1:], old[1:]))
        raise SnapshotError(f"{where}: its mesh {_mesh_text(axes, old)} cannot be laid over {devices} devices (the axes "
                            f"after '{axes[0]}' need {math.prod(old[1:])} devices each: {others}): restore onto a "
                            f"slice whose device count is a multiple of {math.prod(old[1:])}")
    sizes = dict(zip(axes, new))
    shape = meta["shape"]
    shards = 1
    for dim, entry in enumerate(sharding["spec"]):
        count, used = _shards(entry, sizes)
        if dim < len(shape) and shape[dim] % count:
            axis = "', '".join(used)
            raise SnapshotError(f"{where}: dimension {dim} (size {shape[dim]}) is split over mesh axis '{axis}' of "
                                f"size {count} on {devices} devices, which does not divide it: restore onto a slice "
                                f"where {shape[dim]} is a multiple of that axis (the saved mesh was "
                                f"{_mesh_text(axes, old)})")
        shards *= count
    mesh_id = "|".join(f"{a}={s}" for a, s in sizes.items()) + f"|{sharding.get('axis_types')}"
    plan.meshes.setdefault(mesh_id, {"axes": axes, "sizes": new, "axis_types": sharding.get("axis_types")})
    plan.array_mesh[key] = mesh_id
    return meta["nbytes"] / shards


def _leaf(key: str) -> str:
    """'state__3' -> ' (its array 3)': which leaf of a pytree, when it is one of several."""
    index = key.rsplit("__", 1)[-1]
    return "" if index == "0" else f" (its array {index})"


def _mesh_text(axes: list[str], sizes: list[int]) -> str:
    return "(" + ", ".join(f"'{a}': {s}" for a, s in zip(axes, sizes)) + ")"


def _check_hbm(plan: RestorePlan, per_device: float, accelerator, hbm_limit: int | None) -> None:
    """Refuse, in one line, arrays that would not fit in this slice's HBM per chip."""
    devices_per_chip = accelerator.devices // accelerator.chips if accelerator is not None else 1
    plan.per_chip_bytes = int(per_device * devices_per_chip)
    limits = []
    if accelerator is not None:
        limits.append(accelerator.hbm_bytes_per_chip * (1 - hbm_reserve()))
    if hbm_limit:
        limits.append(hbm_limit * devices_per_chip)
    if limits and plan.per_chip_bytes > min(limits):
        usable = min(limits)
        kind = accelerator.name if accelerator is not None else "this slice"
        raise SnapshotError(f"restoring {', '.join(plan.names)} needs {format_bytes(plan.per_chip_bytes)} of HBM per "
                            f"chip, and {kind} has {format_bytes(int(usable))} usable per chip (after the planner's "
                            f"{hbm_reserve():.0%} reserve): restore onto a slice with more chips or more HBM per chip "
                            "(%tpu_plan says which), or restore fewer names")
