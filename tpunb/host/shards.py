"""A host's part of a gather: the shards of a global jax.Array that this host alone sends.

A shard replicated on several devices is sent once, by the lowest process holding it, so the
notebook receives each distinct piece of the array exactly once. Stdlib only at module level:
jax and numpy are imported when a gather asks.
"""
from __future__ import annotations


def _key(index: tuple, shape: tuple) -> tuple:
    """A shard's index (a tuple of slices) as ((start, stop), ...) over the whole shape."""
    return tuple(s.indices(n)[:2] for s, n in zip(index, shape))


def owned(value) -> dict:
    """{shape, dtype, expected: every distinct index, shards: [(index, numpy data)] this host owns}.

    Raises TypeError with the fix when the value is no global jax.Array."""
    import jax
    import numpy as np

    if not isinstance(value, jax.Array):
        raise TypeError(f"a {type(value).__name__} is no jax.Array: fetch it with %tpu_pull NAME")
    shape = tuple(value.shape)
    devices = value.sharding.devices_indices_map(shape)
    owner: dict[tuple, int] = {}
    for device, index in devices.items():
        key = _key(index, shape)
        owner[key] = min(owner.get(key, device.process_index), device.process_index)
    me, sent, shards = jax.process_index(), set(), []
    for shard in value.addressable_shards:
        key = _key(shard.index, shape)
        if owner[key] == me and key not in sent:
            sent.add(key)
            shards.append((key, np.asarray(shard.data)))
    return {"shape": shape, "dtype": np.dtype(value.dtype), "expected": sorted(owner), "shards": shards}
