"""One numpy array from the shards each host sent of a global jax.Array (``Slice.gather``)."""
from __future__ import annotations

from typing import Any

from tpunb.errors import UsageError


def _ranges(key: tuple) -> str:
    """((0, 4), (2, 4)) as [0:4, 2:4], as the array would be indexed."""
    return "[" + ", ".join(f"{a}:{b}" for a, b in key) + "]"


def assemble(name: str, parts: dict[int, dict[str, Any]]) -> Any:
    """Place every host's shards by index into one array; one-line errors for pieces that are
    missing or sent twice (an array that is not one global array over these hosts)."""
    import numpy as np

    local = f"{name} is not one global array over these hosts: fetch each host's with %tpu_pull {name}"
    first = parts[min(parts)]
    shape, dtype, expected = tuple(first["shape"]), first["dtype"], set(map(tuple, first["expected"]))
    if any(tuple(p["shape"]) != shape for p in parts.values()):
        raise UsageError(local + " (its shape differs between hosts)")
    out = np.empty(shape, dtype)
    received: dict[tuple, int] = {}
    for host, part in sorted(parts.items()):
        for key, data in part["shards"]:
            key = tuple(map(tuple, key))
            if key in received:
                raise UsageError(local + f" (hosts {received[key]} and {host} both own {_ranges(key)})")
            received[key] = host
            out[tuple(slice(a, b) for a, b in key)] = data
    missing = sorted(expected - set(received))
    if missing:
        shown = ", ".join(_ranges(k) for k in missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
        raise UsageError(f"{name} is not fully addressable from hosts {sorted(parts)}: no host sent {shown}; "
                         "gather from every host of the slice")
    return out
