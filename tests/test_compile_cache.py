"""JAX's persistent compilation cache on every host: on by default (small, quick programs too),
found again by %tpu_restart, named to cells and services for JAX and vLLM (~ is the host's home); ``--compile-cache gs://...`` is
shared with a new slice of the same shape (Cloud Storage here: gcp-storage-emulator, a real HTTP
server of the JSON API that gcsfs, JAX's path to gs://, talks to). A hit is JAX's own
monitoring event (``/jax/compilation_cache/cache_hits``), never a timing. One-host slices: JAX writes
entries from process 0 only, and on CPU each process of a simulated slice computes its own key."""
from __future__ import annotations

import ast

import pytest

from tpunb import manager
from tpunb.emulator.storage import StorageEmulator
from tpunb.host import gcs
from tests.conftest import wait_for

pytestmark = pytest.mark.jax

#: one SPMD program over every host's devices (the same cache entry for all processes), then which
#: of JAX's cache events it raised on this host
PROGRAM = ("%%on_tpu\nimport jax, jax.numpy as jnp\nfrom jax.sharding import NamedSharding, PartitionSpec as P\n"
           "events = []\njax.monitoring.register_event_listener(lambda name, **kw: events.append(name))\n"
           "mesh = jax.make_mesh((jax.device_count(),), ('x',))\n"
           "make = jax.jit(lambda: jnp.tanh(jnp.arange(4096.0).reshape(64, 64)) @ jnp.ones((64, 64)),\n"
           "               out_shardings=NamedSharding(mesh, P('x')))\n"
           "make().block_until_ready()\n"
           "sorted({e.rsplit('/', 1)[1] for e in events if e.startswith('/jax/compilation_cache/cache_')})")


@pytest.mark.fresh_slice
def test_restart_hits_the_default_cache(cell, isolated_home):
    assert cell("%tpu_launch v4-8 --name warm").error is None
    first = cell(PROGRAM)
    assert first.error is None and "['cache_misses']" == first.shown.strip(), first.shown
    place = isolated_home / "jax-cache"  # a local slice's hosts keep it on this machine, their disk
    assert any(p.name.startswith("jit_") for p in place.iterdir())
    assert cell("%tpu_restart").error is None
    again = cell(PROGRAM)
    assert again.error is None and "['cache_hits']" == again.shown.strip(), again.shown


@pytest.mark.parametrize("make_slice", ["ssh"], indirect=True)
@pytest.mark.fresh_slice
def test_cells_and_services_of_a_remote_host_find_the_cache_in_its_home(make_slice, cell):
    make_slice(1)
    where = cell("%%on_tpu\nimport os\nplace = os.path.expanduser('~/.tpunb/jax-cache')\n"
                 "place, os.environ['JAX_COMPILATION_CACHE_DIR'] == os.environ['VLLM_XLA_CACHE_PATH'] == place")
    place, same = ast.literal_eval(where.shown.strip())
    assert same and place.startswith("/"), where.shown  # each test host has a home of its own
    assert cell("%tpu_serve where -- echo $JAX_COMPILATION_CACHE_DIR $VLLM_XLA_CACHE_PATH").error is None
    wait_for(lambda: {s.state for s in manager.current().services() if s.name == "where"} == {"exited"},
             what="the service to exit")
    assert f"{place} {place}\n" in cell("%tpu_logs where").stdout


@pytest.fixture
def storage(monkeypatch):
    with StorageEmulator(("shared-cache",)) as server:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", server.url)  # local hosts inherit it, as a VM has its storage
        yield server


@pytest.mark.fresh_slice
def test_a_gs_cache_serves_use_from_a_new_kernel_and_a_new_slice_of_the_same_shape(cell, storage, isolated_home):
    for bad in ("/tmp/cache", "gs://", "s3://bucket/jax"):
        refused = cell(f"%tpu_launch v4-8 --compile-cache {bad}")
        assert type(refused.error).__name__ == "UsageError" and "give a Cloud Storage place, gs://BUCKET/PATH" in \
            str(refused.error) and "Traceback" not in refused.shown
    assert cell("%tpu_launch v4-8 --name first --compile-cache gs://shared-cache/jax/").error is None
    first = cell(PROGRAM)
    assert "['cache_misses']" == first.shown.strip() and not first.stderr, first.shown
    assert any(name.startswith("jax/jit_") for name, _ in gcs.Bucket("shared-cache").list("jax/"))
    manager.detach_all()  # a kernel restart: %tpu_use reads the place from the slice's record
    assert cell("%tpu_use first").error is None
    assert "['cache_hits']" == cell(PROGRAM).shown.strip()
    assert cell("%tpu_down first").error is None
    assert cell("%tpu_launch v4-8 --name second --compile-cache gs://shared-cache/jax").error is None
    second = cell(PROGRAM)
    assert "['cache_hits']" == second.shown.strip(), second.shown
    assert not (isolated_home / "jax-cache").exists()  # the hosts' own disk cache was not the one used
