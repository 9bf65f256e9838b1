"""Every Cloud TPU slice tpunb knows: names, shapes, per-chip specs, prices, zones.

One source of truth for the simulated slice (how many hosts, devices per host), the API
emulator (valid accelerator types and zones) and the planner (FLOP/s, HBM, $/hour). The
numbers live in ``tpunb/data/catalog.json`` with the sources they come from; this module only
reads them. It imports nothing heavy: pandas is imported inside :func:`table`.
"""
from __future__ import annotations

import difflib
import functools
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpunb.errors import ProvisionError, UnknownAcceleratorError, UsageError
from tpunb.units import either

if TYPE_CHECKING:
    import pandas

CATALOG_PATH = Path(__file__).parent / "data" / "catalog.json"
GIB = 2**30


@dataclass(frozen=True)
class Generation:
    """One TPU generation: how its names are spelled and what each chip can do."""

    key: str
    prefix: str
    aliases: tuple[str, ...]
    size_unit: str  # "tensorcores" or "chips": what the number in the name counts
    tensorcores_per_chip: int
    devices_per_chip: int
    chips_per_host: int
    max_single_host_chips: int
    sizes: dict[int, str]  # name suffix -> topology
    hbm_bytes_per_chip: float
    hbm_bandwidth: float
    bf16_flops: float
    int8_ops: float
    ici_bandwidth: float  # one-way, one link, bytes/s
    ici_links: int
    ici_wraparound_min: int
    price_on_demand: float | None  # USD per chip-hour
    price_spot: float | None
    default_runtime: str
    zones: tuple[str, ...]
    zone_sizes: dict[str, tuple[int, ...]]
    sources: dict[str, tuple[str, ...]]
    planning_only: str = ""  # why it can be planned for but not launched ("": it can be launched)
    #: the oldest (jax, libtpu) known to drive this generation: {"jax", "libtpu", "python"} (its
    #: sources under ``sources["jax"]``); None: no jax release a host's Python installs is known to fail it
    jax_min: dict[str, Any] | None = None

    def name(self, size: int) -> str:
        return f"{self.prefix}-{size}"

    def size_names(self) -> list[str]:
        return [self.name(s) for s in sorted(self.sizes)]


@dataclass(frozen=True)
class Accelerator:
    """One slice shape, e.g. ``v4-16``: what the Cloud TPU API calls an accelerator type."""

    name: str
    generation: str
    chips: int
    tensorcores: int
    hosts: int
    chips_per_host: int
    devices_per_host: int
    devices: int
    topology: str
    hbm_bytes_per_chip: float
    hbm_bandwidth: float
    bf16_flops: float
    int8_ops: float
    ici_bandwidth: float
    ici_links: int
    price_per_chip_hour: float | None
    spot_price_per_chip_hour: float | None
    default_runtime: str
    zones: tuple[str, ...]
    planning_only: str = ""  # why it can be planned for but not launched ("": it can be launched)

    @property
    def hbm_bytes(self) -> float:
        """HBM of the whole slice."""
        return self.hbm_bytes_per_chip * self.chips

    @property
    def peak_bf16_flops(self) -> float:
        """bf16 FLOP/s of the whole slice."""
        return self.bf16_flops * self.chips

    @property
    def mesh_shape(self) -> tuple[int, ...]:
        """The topology as a tuple of ints, e.g. (2, 2, 4)."""
        return tuple(int(x) for x in self.topology.split("x"))

    @property
    def has_price(self) -> bool:
        return self.price_per_chip_hour is not None

    def price_per_hour(self, spot: bool = False) -> float:
        """USD per hour for the whole slice (list price, us-central1)."""
        per_chip = self.spot_price_per_chip_hour if spot else self.price_per_chip_hour
        if per_chip is None:
            raise UsageError(
                f"{self.name} has no public {'spot' if spot else 'on-demand'} list price; "
                "compare it by time, or pick a generation with a list price"
            )
        return per_chip * self.chips


@functools.lru_cache(maxsize=1)
def _load() -> dict[str, Any]:
    with open(CATALOG_PATH, encoding="utf-8") as f:
        return json.load(f)


@functools.lru_cache(maxsize=1)
def _generations() -> dict[str, Generation]:
    gens = {}
    for key, g in _load()["generations"].items():
        gens[key] = Generation(
            key=key,
            prefix=g["prefix"],
            aliases=tuple(g["aliases"]),
            size_unit=g["size_unit"],
            tensorcores_per_chip=g["tensorcores_per_chip"],
            devices_per_chip=g["devices_per_chip"],
            chips_per_host=g["chips_per_host"],
            max_single_host_chips=g["max_single_host_chips"],
            sizes={int(k): v for k, v in g["sizes"].items()},
            hbm_bytes_per_chip=float(g["hbm_gib"] * GIB),
            hbm_bandwidth=float(g["hbm_bandwidth"]),
            bf16_flops=float(g["bf16_flops"]),
            int8_ops=float(g["int8_ops"]),
            ici_bandwidth=float(g["ici_bandwidth"]),
            ici_links=int(g["ici_links"]),
            ici_wraparound_min=int(g["ici_wraparound_min"]),
            price_on_demand=g["price_on_demand"],
            price_spot=g["price_spot"],
            default_runtime=g["default_runtime"],
            zones=tuple(g["zones"]),
            zone_sizes={z: tuple(s) for z, s in g.get("zone_sizes", {}).items()},
            sources={k: tuple(v) for k, v in g["sources"].items()},
            planning_only=g.get("planning_only", ""),
            jax_min=g.get("jax_min"),
        )
    return gens


@functools.lru_cache(maxsize=1)
def _alias_index() -> dict[str, str]:
    return {alias: key for key, g in _generations().items() for alias in (key, *g.aliases)}


def generations() -> list[Generation]:
    """Every generation in the catalog, oldest first."""
    return list(_generations().values())


def generation(name: str) -> Generation:
    """A generation by key or alias (``v5e``, ``v5litepod``, ``trillium``...)."""
    key = _alias_index().get(name.strip().lower())
    if key is None:
        close = difflib.get_close_matches(name.lower(), list(_alias_index()), n=3, cutoff=0.5)
        hint = f"; did you mean {either(close)}?" if close else ""
        raise UnknownAcceleratorError(
            f"unknown TPU generation {name!r}: known are {', '.join(_generations())}{hint}"
        )
    return _generations()[key]


def names(generation_key: str | None = None) -> list[str]:
    """Every canonical accelerator name, or those of one generation."""
    gens = [generation(generation_key)] if generation_key else generations()
    return [n for g in gens for n in g.size_names()]


def sources() -> dict[str, dict[str, str]]:
    """Where the catalog's numbers come from (id -> title, url, what it covers)."""
    return dict(_load()["sources"])


_NAME_RE = re.compile(r"^(?P<gen>[a-z0-9-]*?[a-z0-9]+)-(?P<size>\d+)$")


def lookup(name: str) -> Accelerator:
    """The accelerator called ``name``: ``v4-16``, ``tpu-v4-16``, ``V4-16``, ``v5e-8``, ...

    Raises UnknownAcceleratorError with one line that lists the valid sizes and the closest
    names, so a typo costs a glance instead of a failed create call.
    """
    if not isinstance(name, str):
        raise UnknownAcceleratorError(f"accelerator name must be a string like 'v4-8', not {name!r}")
    return _lookup(re.sub(r"\s+", "", name.lower()).replace("_", "-"))


@functools.lru_cache(maxsize=None)
def _lookup(norm: str) -> Accelerator:
    m = _NAME_RE.match(norm)
    if m:
        gen_name = m["gen"]
        key = _alias_index().get(gen_name)
        if key is None and gen_name.startswith("tpu-"):
            key = _alias_index().get(gen_name[4:])
        if key is not None:
            g = _generations()[key]
            size = int(m["size"])
            if size in g.sizes:
                return _accelerator(key, size)
            raise UnknownAcceleratorError(_wrong_size_message(norm, g, size))
    raise UnknownAcceleratorError(_unknown_message(norm))


@functools.lru_cache(maxsize=None)
def _accelerator(key: str, size: int) -> Accelerator:
    """One Accelerator object per shape, however it was spelled."""
    g = _generations()[key]
    topology = g.sizes[size]
    acc = _build(g, topology, g.name(size), tuple(z for z in g.zones if size in g.zone_sizes.get(z, (size,))))
    expected = acc.tensorcores if g.size_unit == "tensorcores" else acc.chips
    if expected != size:  # a broken data file must fail loudly, not launch the wrong shape
        raise RuntimeError(f"catalog.json: {acc.name} has topology {topology} ({acc.chips} chips)")
    return acc


def _build(g: Generation, topology: str, name: str, zones: tuple[str, ...]) -> Accelerator:
    chips = math.prod(int(x) for x in topology.split("x"))
    if chips <= g.max_single_host_chips:
        hosts, chips_per_host = 1, chips
    else:
        hosts, chips_per_host = math.ceil(chips / g.chips_per_host), g.chips_per_host
    return Accelerator(
        name=name,
        generation=g.key,
        chips=chips,
        tensorcores=chips * g.tensorcores_per_chip,
        hosts=hosts,
        chips_per_host=chips_per_host,
        devices_per_host=chips_per_host * g.devices_per_chip,
        devices=chips * g.devices_per_chip,
        topology=topology,
        hbm_bytes_per_chip=g.hbm_bytes_per_chip,
        hbm_bandwidth=g.hbm_bandwidth,
        bf16_flops=g.bf16_flops,
        int8_ops=g.int8_ops,
        ici_bandwidth=g.ici_bandwidth,
        ici_links=g.ici_links,
        price_per_chip_hour=g.price_on_demand,
        spot_price_per_chip_hour=g.price_spot,
        default_runtime=g.default_runtime,
        zones=zones,
        planning_only=g.planning_only,
    )


def hypothetical(generation_key: str, topology: str | None = None, chips: int | None = None) -> Accelerator:
    """A slice of any shape for planning, e.g. the book's full v5p pod ``("v5p", "16x20x28")``.

    Not something the Cloud TPU API accepts: use :func:`lookup` for real accelerator types.
    """
    g = generation(generation_key)
    if topology is None:
        if not chips or chips < 1:
            raise UsageError("give a topology like 16x20x28 or a chip count")
        dims = len(next(iter(g.sizes.values())).split("x"))
        topology = "x".join(str(s) for s in _factor(int(chips), dims))
    if not re.fullmatch(r"\d+(x\d+)*", topology.lower()):
        raise UsageError(f"topology {topology!r} should look like 4x4 or 16x20x28")
    acc = _build(g, topology.lower(), f"{g.key} {topology.lower()}", g.zones)
    if chips is not None and chips != acc.chips:
        raise UsageError(f"topology {topology} has {acc.chips} chips, not {chips}")
    return acc


def _factor(n: int, dims: int) -> list[int]:
    """Split n chips into ``dims`` near-equal axis lengths, shortest first."""
    out = []
    for k in range(dims, 0, -1):
        target = round(n ** (1 / k))
        best = min((d for d in range(1, n + 1) if n % d == 0), key=lambda d: (abs(d - target), d))
        out.append(best)
        n //= best
    return sorted(out)


def _sizes_listing(g: Generation, limit: int = 6) -> str:
    listed = g.size_names()
    text = ", ".join(listed[:limit]) + (", ..." if len(listed) > limit else "")
    return f"{g.key} sizes are {text} (up to {listed[-1]})" if len(listed) > limit else f"{g.key} sizes are {text}"


def _wrong_size_message(norm: str, g: Generation, size: int) -> str:
    below = [s for s in g.sizes if s < size]
    above = [s for s in g.sizes if s > size]
    near = ([max(below)] if below else []) + ([min(above)] if above else [])
    unit = (
        f"; the number counts TensorCores, {g.tensorcores_per_chip} per chip"
        if g.size_unit == "tensorcores"
        else "; the number counts chips"
    )
    return (
        f"unknown accelerator {norm!r}: {_sizes_listing(g)}{unit}; "
        f"did you mean {either([g.name(s) for s in near])}?"
    )


def _unknown_message(norm: str) -> str:
    bare = norm[4:] if norm.startswith("tpu-") else norm
    if bare in _alias_index() or norm in _alias_index():
        g = generation(bare if bare in _alias_index() else norm)
        return f"accelerator {norm!r} needs a size: {_sizes_listing(g)}"
    m = _NAME_RE.match(bare)
    gen_part, size = (m["gen"], int(m["size"])) if m else (bare, None)
    close_gens = difflib.get_close_matches(gen_part, list(_alias_index()), n=2, cutoff=0.5)
    close: list[str] = []
    for alias in close_gens:
        g = generation(alias)
        fits = [s for s in sorted(g.sizes) if size is None or s >= size] or sorted(g.sizes)[-1:]
        if g.name(fits[0]) not in close:
            close.append(g.name(fits[0]))
    if not close:
        close = difflib.get_close_matches(norm, names(), n=3, cutoff=0.6)
    hint = f"; did you mean {either(close)}?" if close else ""
    gens = ", ".join(f"{g.prefix}-N" for g in generations())
    return f"unknown accelerator {norm!r}: names look like {gens}{hint}"


def check_launchable(acc: Accelerator) -> None:
    """A planning-only type is a one-line UsageError before anything is asked of a cloud (which API
    can make a type is the backend's: tpunb/provision/gcp/apis.py)."""
    if acc.planning_only:
        raise UsageError(f"{acc.name} is for planning only ({acc.planning_only}): %tpu_plan and %tpu_catalog "
                         "show it; launch a v6e or older type")


def check_zone(acc: Accelerator | str, zone: str) -> None:
    """Raise ProvisionError (one line, with the zones that do offer it) if ``zone`` lacks ``acc``."""
    acc = lookup(acc) if isinstance(acc, str) else acc
    check_launchable(acc)
    if zone in acc.zones:
        return
    g = _generations()[acc.generation]
    if zone in g.zones:
        raise ProvisionError(
            f"{acc.name} is not offered in {zone} (it offers {g.key} in other sizes); "
            f"zones with {acc.name}: {', '.join(acc.zones)}"
        )
    close = difflib.get_close_matches(zone, list(acc.zones), n=1, cutoff=0.8)
    hint = f" (did you mean {close[0]}?)" if close else ""
    raise ProvisionError(
        f"{acc.name} is not offered in zone {zone!r}{hint}; zones with {acc.name}: {', '.join(acc.zones)}"
    )


def region_of(zone: str) -> str:
    """us-central1-a -> us-central1."""
    return zone.rsplit("-", 1)[0]


def zones_near(acc: Accelerator | str, region: str | None = None) -> list[str]:
    """The zones offering ``acc``, nearest to ``region`` first: the same region, then the same
    area (us-central*), then the same continent (us-*); the catalog's order otherwise."""
    acc = lookup(acc) if isinstance(acc, str) else acc
    return nearest(acc.zones, region)


def nearest(zones: Sequence[str], region: str | None = None) -> list[str]:
    """``zones`` nearest to ``region`` first (their order otherwise, and where equally near)."""
    if not region:
        return list(zones)

    def distance(zone: str) -> int:
        theirs = region_of(zone)
        if theirs == region:
            return 0
        if theirs.rstrip("0123456789") == region.rstrip("0123456789"):
            return 1
        return 2 if theirs.split("-")[0] == region.split("-")[0] else 3

    return sorted(zones, key=distance)


def zones() -> list[str]:
    """Every zone that offers some TPU, sorted."""
    return sorted({z for g in generations() for z in g.zones})


def all_accelerators() -> list[Accelerator]:
    """Every slice shape in the catalog, by generation then size."""
    return [lookup(n) for n in names()]


def _row(acc: Accelerator) -> dict[str, Any]:
    return {
        "name": acc.name,
        "generation": acc.generation,
        "chips": acc.chips,
        "tensorcores": acc.tensorcores,
        "hosts": acc.hosts,
        "chips_per_host": acc.chips_per_host,
        "devices_per_host": acc.devices_per_host,
        "devices": acc.devices,
        "topology": acc.topology,
        "hbm_gib_per_chip": acc.hbm_bytes_per_chip / GIB,
        "hbm_gb_s_per_chip": acc.hbm_bandwidth / 1e9,
        "bf16_tflops_per_chip": acc.bf16_flops / 1e12,
        "int8_tops_per_chip": acc.int8_ops / 1e12,
        "ici_gb_s_per_link": acc.ici_bandwidth / 1e9,
        "hbm_gib_total": acc.hbm_bytes / GIB,
        "bf16_pflops_total": acc.peak_bf16_flops / 1e15,
        "usd_per_hour": acc.price_per_hour() if acc.has_price else None,
        "spot_usd_per_hour": (
            acc.price_per_hour(spot=True) if acc.spot_price_per_chip_hour is not None else None
        ),
        "default_runtime": acc.default_runtime,
        "zones": f"planning only: {acc.planning_only}" if acc.planning_only else ", ".join(acc.zones),
    }


def select(filter: str | None = None) -> list[Accelerator]:
    """Accelerators matching ``filter``: words that are generations, zones/regions or names.

    Words of one kind are OR-ed, kinds are AND-ed: ``"v5e v6e us-east5"`` means v5e or v6e
    slices offered in a us-east5 zone. A word that is none of these raises
    UnknownAcceleratorError with close names.
    """
    accs = all_accelerators()
    if not filter or not filter.strip():
        return accs
    gens: set[str] = set()
    places: list[str] = []
    exact: set[str] = set()
    for word in re.split(r"[\s,]+", filter.strip().lower()):
        if not word:
            continue
        if word in _alias_index():
            gens.add(_alias_index()[word])
        elif any(z.startswith(word) for z in zones()):
            places.append(word)
        else:
            exact.add(lookup(word).name)  # raises the one-line suggestion error
    return [
        a
        for a in accs
        if (not gens or a.generation in gens)
        and (not exact or a.name in exact)
        and (not places or any(z.startswith(p) for z in a.zones for p in places))
    ]


def table(filter: str | None = None) -> "pandas.DataFrame":
    """The catalog as a DataFrame, one row per slice shape (see :func:`select` for ``filter``)."""
    import pandas

    rows = [_row(a) for a in select(filter)]
    frame = pandas.DataFrame(rows) if rows else pandas.DataFrame(columns=list(_row(lookup("v4-8"))))
    return frame.set_index("name")


def from_topology(generation_key: str, topology: str) -> Accelerator:
    """The catalog's accelerator for ``--topology 4x4x4`` as Google's Compute Engine pages write it
    (``("tpu7x", "2x2x4")`` -> ``tpu7x-32``)."""
    g = generation(generation_key)
    wanted = re.sub(r"\s+", "", str(topology).lower())
    for size, shape in sorted(g.sizes.items()):
        if shape == wanted:
            return lookup(g.name(size))
    known = ", ".join(g.sizes[s] for s in sorted(g.sizes))
    raise UnknownAcceleratorError(f"{g.key} has no topology {topology!r}: its topologies are {known}")
