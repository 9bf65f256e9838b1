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
from tpunb.sandbox.storage.cloud_storage import StorageEmulator
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


def test_a_hosts_own_cache_takes_every_program_up_to_a_bound_and_a_gs_cache_keeps_tiny_ones_out():
    from tpunb.provision.common import LOCAL_CACHE_BYTES, compile_cache_env
    from tpunb.registry import SliceRecord

    local = compile_cache_env(SliceRecord("a", "v4-8", "local", "running"), "~/.tpunb")
    assert local == {"JAX_COMPILATION_CACHE_DIR": "~/.tpunb/jax-cache", "VLLM_XLA_CACHE_PATH": "~/.tpunb/jax-cache",
                     "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1",
                     "JAX_COMPILATION_CACHE_MAX_SIZE": str(LOCAL_CACHE_BYTES)}
    shared = compile_cache_env(SliceRecord("b", "v4-8", "local", "running",
                                           spec={"compile_cache": "gs://b/jax"}), "~/.tpunb")
    assert shared == {"JAX_COMPILATION_CACHE_DIR": "gs://b/jax", "VLLM_XLA_CACHE_PATH": "gs://b/jax"}, \
        "JAX's own minimum compile time (1 s) and entry size apply; no size bound (its lock is local only)"


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
    # this program compiles in far less than JAX's 1 s minimum, which keeps it out of a gs:// cache: let it in
    assert cell("%tpu_launch v4-8 --name first --compile-cache gs://shared-cache/jax/ "
                "--env JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0").error is None
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


#: process 0's cache entries on this host, and whether JAX's own cache here returns each of them
ENTRIES = ("%%on_tpu\nimport hashlib, os\nimport jax\nfrom jax._src import compilation_cache as cc\n"
           "root = os.environ['JAX_COMPILATION_CACHE_DIR']\ncache = cc._get_cache(jax.devices()[0].client)\n"
           "keys = sorted(n[:-len('-cache')] for n in os.listdir(root) if n.endswith('-cache'))\n"
           "[(k, hashlib.sha256(open(os.path.join(root, k + '-cache'), 'rb').read()).hexdigest(), "
           "cache.get(k) is not None, os.path.exists(os.path.join(root, k + '-atime'))) for k in keys]")


@pytest.mark.sandbox
@pytest.mark.jax
@pytest.mark.fresh_slice
def test_restart_copies_process_0s_entries_to_every_host_and_counts_hits_per_host(cell, sshd, ssh_key, monkeypatch):
    """Two hosts, each its cache on its own disk: JAX writes from process 0 only, so host 1 has none;
    %tpu_restart copies them, and JAX's cache on host 1 returns them by process 0's key (on a TPU
    slice every process computes that key; on CPU each process's differs, so host 1 still compiles
    here: its hits are counted, not assumed)."""
    from tests.test_fetch_sources import connect, homes

    connect(sshd, ssh_key, monkeypatch, "cached")
    first = cell(PROGRAM)
    assert first.error is None and "['cache_misses']" in first.shown, first.shown
    host0, host1 = (home / ".tpunb/jax-cache" for home in homes(sshd))
    written = sorted(p.name for p in host0.glob("jit_*-cache"))
    assert written and not list(host1.glob("jit_*-cache")), "JAX wrote from process 0 only"
    restarted = cell("%tpu_restart")
    assert restarted.error is None, restarted.shown
    assert f"{len(written)} compile-cache entr{'ies' if len(written) > 1 else 'y'} of host 0 copied to host 1" in \
        restarted.stdout, restarted.stdout
    assert cell(ENTRIES).error is None
    held = manager.last_result().reprs
    on0, on1 = (ast.literal_eval(held[i]) for i in (0, 1))
    assert on0 == on1 and [k + "-cache" for k, *_ in on0] == written, (on0, on1)
    assert all(found and atime for _, _, found, atime in on1), "JAX's cache on host 1 returns each by its key"
    again = cell(PROGRAM)
    assert again.error is None, again.shown
    stats = manager.current().compile_cache_stats()
    assert stats[0]["hits"] == stats[0]["requests"] >= 1 and stats[0]["written"] == 0, stats
    assert stats[1]["requests"] >= 1 and stats[1]["hits"] + stats[1]["misses"] == stats[1]["requests"], stats
    assert not (host1 / ".tpunb-incoming").exists() and not (host0 / ".tpunb-incoming").exists()
    again_restarted = cell("%tpu_restart")
    assert "copied" not in again_restarted.stdout, "nothing new: nothing copied"
