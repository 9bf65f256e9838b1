"""%tpu_pull --gather and Slice.gather on real multi-process JAX: a global jax.Array comes back as
one numpy array, each distinct shard sent once, by the host that owns it."""
from __future__ import annotations

import numpy as np
import pytest

from tpunb.errors import RemoteError, UsageError

pytestmark = pytest.mark.jax

MAKE = ("%%on_tpu\nimport jax, numpy as np\nfrom jax.sharding import NamedSharding, PartitionSpec as P\n"
        "mesh = jax.make_mesh((4, 2), ('x', 'y'), devices=jax.devices())\n"
        "def make(spec, dtype):\n"
        "    full = np.arange(48, dtype=dtype).reshape(8, 6)\n"
        "    return jax.make_array_from_callback(full.shape, NamedSharding(mesh, spec), lambda i: full[i])\n"
        "rows, tiles = make(P('x'), 'float32'), make(P('x', 'y'), 'int32')\n"
        "cols, same = make(P(None, 'y'), 'float32'), make(P(), 'int16')\n"
        "loc = jax.numpy.arange(4) + jax.process_index()\n"
        "plain = 3\n"
        "[len(v.addressable_shards) for v in (rows, tiles, cols, same)]")


def sent(sl, name: str) -> dict[int, int]:
    """How many shards each host sent for ``name``."""
    return {host: len(part["shards"]) for host, part in sl.session.gather(name, [0, 1]).items()}


@pytest.mark.fresh_slice
def test_gather_assembles_each_sharding_once_per_distinct_shard(make_slice, cell, ip):
    sl = make_slice(2)
    made = cell(MAKE)
    assert made.error is None and "Out[0-1]: [4, 4, 4, 4]" in made.shown, made.shown
    for name, dtype in (("rows", np.float32), ("tiles", np.int32), ("cols", np.float32), ("same", np.int16)):
        value = sl.gather(name)
        assert value.dtype == dtype and value.shape == (8, 6), (name, value.dtype, value.shape)
        np.testing.assert_array_equal(value, np.arange(48, dtype=dtype).reshape(8, 6))
    assert sent(sl, "rows") == {0: 2, 1: 2}  # 4 row blocks, each on 2 devices of one host
    assert sent(sl, "tiles") == {0: 4, 1: 4}
    assert sent(sl, "cols") == {0: 2, 1: 0}  # 2 column blocks on both hosts: host 0 alone sends them
    assert sent(sl, "same") == {0: 1, 1: 0}  # fully replicated: once
    run = cell("%tpu_pull tiles --gather")
    assert run.error is None, run.shown
    np.testing.assert_array_equal(ip.user_ns["tiles"], np.arange(48, dtype=np.int32).reshape(8, 6))


@pytest.mark.fresh_slice
def test_gather_says_what_is_missing_or_what_to_use(make_slice, cell):
    sl = make_slice(2)
    assert cell(MAKE).error is None
    try:
        sl.gather("cols", hosts=[1])
    except UsageError as exc:
        assert str(exc) == ("cols is not fully addressable from hosts [1]: no host sent [0:8, 0:3], [0:8, 3:6]; "
                            "gather from every host of the slice")
    else:
        raise AssertionError("a gather from host 1 alone assembled cols")
    local = cell("%tpu_pull loc --gather")
    assert isinstance(local.error, UsageError)
    assert str(local.error) == ("loc is not one global array over these hosts: fetch each host's with "
                                "%tpu_pull loc (hosts 0 and 1 both own [0:4])")
    plain = cell("%tpu_pull plain --gather")
    assert isinstance(plain.error, RemoteError) and "is no jax.Array: fetch it with %tpu_pull NAME" in str(plain.error)
    assert "\n" not in str(plain.error)
    both = cell("%tpu_pull rows --gather --host 0")
    assert isinstance(both.error, UsageError) and "drop --host" in str(both.error)
    nameless = cell("%tpu_pull --gather")
    assert isinstance(nameless.error, UsageError) and "Usage: %tpu_pull" in str(nameless.error)
    try:
        sl.gather("not a name")
    except UsageError as exc:
        assert "gather takes a variable name" in str(exc)
    else:
        raise AssertionError("gather accepted 'not a name'")
