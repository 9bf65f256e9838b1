"""What a launch's arguments must be, each refused in one line that says what to give instead."""
from __future__ import annotations

import re
from typing import Any

from tpunb import catalog
from tpunb.errors import UsageError

#: generations whose slices cannot be joined into a multislice (docs/cloud-facts.md)
NO_MULTISLICE = ("v2", "v3")


def slice_count(slices: Any) -> int:
    """--slices N: a whole number >= 1 (None: one slice)."""
    if slices is None:
        return 1
    if isinstance(slices, bool) or not isinstance(slices, int) or slices < 1:
        raise UsageError(f"--slices takes a whole number of slices >= 1, e.g. --slices 2, not {slices!r}")
    return slices


def check_multislice(accel: catalog.Accelerator, count: int) -> None:
    """--slices N > 1 only for generations Cloud TPU joins over the data-centre network."""
    if count > 1 and accel.generation in NO_MULTISLICE:
        raise UsageError(f"--slices {count}: {accel.generation} has no multislice (Cloud TPU joins slices over "
                         f"the data-centre network from v4 on): launch one {accel.name}, or a v4, v5e, v5p or v6e "
                         "type")


def compile_cache(place: str | None) -> str | None:
    """``--compile-cache``: a Cloud Storage place, gs://BUCKET/PATH, or a one-line UsageError."""
    if place is None:
        return None
    if not re.fullmatch(r"gs://[a-z0-9][-_.a-z0-9]{1,220}[a-z0-9](/\S*)?", str(place)):
        raise UsageError(f"--compile-cache {place}: give a Cloud Storage place, gs://BUCKET/PATH (each host "
                         "already keeps a cache on its own disk; only one in Cloud Storage outlives the slice)")
    return str(place).rstrip("/")
