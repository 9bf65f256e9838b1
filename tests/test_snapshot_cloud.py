"""Snapshots of cloud slices, against the Cloud TPU API emulator (real sshd hosts with a metadata
server each) and Cloud Storage on this machine (gcp-storage-emulator, a real HTTP server of the
JSON API: tpunb's client, gcsfs and tensorstore all talk to it). A spot slice gets the modelled
preemption notice; its armed names are saved before it dies, and --recover restores them."""
from __future__ import annotations

import ast
import threading

import pytest

from tpunb import manager
from tpunb.sandbox.storage.cloud_storage import StorageEmulator
from tpunb.host import gcs
from tests.conftest import wait_for
from tests.emulator_fixture import FAST

ZONE = "us-central2-b"
BUCKET = "snaps"


@pytest.fixture
def storage(monkeypatch):
    with StorageEmulator((BUCKET,)) as server:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", server.url)
        monkeypatch.setenv("TPUNB_BUCKET", BUCKET)
        yield server


@pytest.fixture
def tpu_emulator_options(sshd):
    return {**FAST, **sshd.emulator_options()}  # power-off ends the hosts' processes: the notice's SIGTERM reaches them


@pytest.fixture
def cloud(tpu_emulator, storage, monkeypatch):
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "proj")
    monkeypatch.setenv("CLOUDSDK_COMPUTE_ZONE", ZONE)
    monkeypatch.setenv("TPUNB_WATCH_INTERVAL", "0.2")
    yield tpu_emulator
    manager.detach_all()


def launch_line(sshd, storage, extra: str = "") -> str:
    """A spot v4-16 on the bare image (tpunb prepares its hosts), its hosts told where Cloud Storage is,
    JAX's compilation cache in the bucket (the slice's record keeps it for --recover). The test's
    program compiles in milliseconds, which JAX's own minimum (a second: tpunb's default for a
    gs:// cache, where each write is a request) would keep out: the user's setting lets it in."""
    return (f"%tpu_launch v4-16 --name spotty --spot --env STORAGE_EMULATOR_HOST={storage.url} "
            f"JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 --compile-cache gs://{BUCKET}/jax {extra}")


MAKE = ("%%on_tpu\nimport jax, numpy as np\nfrom jax.sharding import NamedSharding, PartitionSpec as P\n"
        "mesh = jax.make_mesh((8,), ('x',))\n"
        "x = jax.device_put(np.zeros((64, 16), np.float32), NamedSharding(mesh, P('x')))\n"
        "step = 0\nn = 5")
#: a training loop that logs every step: where a pending notice is acted on
TRAIN = ("%%on_tpu\nimport time, tpunb\nadd = jax.jit(lambda a: a + 1)\n"
         "for _ in range(400):\n    x = add(x)\n    step += 1\n    tpunb.log(step, loss=1.0 / step)\n"
         "    time.sleep(0.05)\n")


#: one SPMD program over both hosts; per host, which of JAX's own cache events it raised
#: (compile_requests_use_cache: it looked in the persistent cache) and the cache key it looked up
CACHED = ("%%on_tpu\nimport jax, jax.numpy as jnp\nfrom jax._src import compilation_cache as cc\n"
          "from jax.sharding import NamedSharding, PartitionSpec as P\nevents, keys = [], []\n"
          "jax.monitoring.register_event_listener(lambda name, **kw: events.append(name))\n"
          "key_of = cc.get_cache_key\ncc.get_cache_key = lambda *a, **k: keys.append(key_of(*a, **k)) or keys[-1]\n"
          "whole = jax.make_mesh((jax.device_count(),), ('x',))\n"
          "jax.jit(lambda: jnp.tanh(jnp.arange(4096.0).reshape(64, 64)) @ jnp.ones((64, 64)),\n"
          "        out_shardings=NamedSharding(whole, P('x')))().block_until_ready()\ncc.get_cache_key = key_of\n"
          "(sorted({e.rsplit('/', 1)[1] for e in events} & {'compile_requests_use_cache', 'cache_hits', 'cache_misses'}), "
          "keys)")


def cache_use(cell) -> list:
    """Per host: (JAX's cache events, the keys it looked up)."""
    run = cell(CACHED)
    assert run.error is None, run.shown
    reprs = manager.last_result().reprs
    return [ast.literal_eval(reprs[i]) for i in sorted(reprs)]


def preempt_during(cloud, cell, code: str, notice: float | None, after: float = 1.5):
    """Run ``code`` while the node is preempted ``after`` s into it (with ``notice`` s of notice)."""
    timer = threading.Timer(after, cloud.preempt, args=("spotty",), kwargs={"notice": notice})
    timer.start()
    try:
        return cell(code)
    finally:
        timer.cancel()


def recover_after(cloud, cell, sshd, storage, notice: float | None = None):
    """Preempt the node now (``notice``: with that many seconds of notice; 0: none), wait until the
    cloud says PREEMPTED, then %tpu_launch --recover it."""
    if notice is not None:
        cloud.preempt("spotty", notice=notice)
    wait_for(lambda: manager.current().node.info is not None and manager.current().node.info.state == "PREEMPTED", 30,
             "the node preempted")
    recovered = cell(launch_line(sshd, storage).replace("v4-16 --name spotty --spot", "--recover spotty"))
    assert recovered.error is None, recovered.shown
    return recovered


@pytest.mark.fresh_slice
@pytest.mark.jax
def test_armed_names_are_saved_at_the_notice_and_recover_restores_them(cloud, cell, sshd, storage):
    armed = cell(launch_line(sshd, storage, "--snapshot-on-preempt x,step,n"))
    assert armed.error is None, armed.shown
    assert "armed: on a preemption notice every host of 'spotty' snapshots x, step, n" in armed.stdout, armed.stdout
    assert "metadata" in armed.stdout
    assert cell(MAKE).error is None
    # the compile cache in gs://: host 0 looks, misses and writes the entry there; host 1 looks too,
    # under a key of its own (JAX on CPU keys each process apart, and only process 0 writes)
    (events0, [key0]), (events1, [key1]) = cache_use(cell)
    assert (events0, events1) == (["cache_misses", "compile_requests_use_cache"], ["compile_requests_use_cache"])
    written = {name for name, _ in gcs.Bucket(BUCKET).list("jax/")}
    assert f"jax/{key0}-cache" in written and key1 != key0 and f"jax/{key1}-cache" not in written, (key0, key1, written)
    # the real 30 s window (two JAX hosts syncing a step and writing with orbax, on a loaded 2-core CI
    # machine beside the kernel and both emulators, missed an 8 s one in about 1 run of 10)
    trained = preempt_during(cloud, cell, TRAIN, notice=30.0)
    assert trained.error is not None, trained.shown  # the guest's shutdown took the connections: the cell failed
    # the hosts went on without their kernel, agreed on a step, saved, and only then ended
    wait_for(lambda: any(name.endswith("/manifest.json") and "/preempt-" in name
                         for name, _ in gcs.Bucket(BUCKET).list("tpunb-snapshots/spotty/")), 30, "the notice's snapshot")
    # and with their last process ended, the guests halted: the node is off long before the window's end
    wait_for(lambda: [n["state"] for n in cloud.nodes() if n["name"].endswith("/nodes/spotty")] == ["PREEMPTED"],
             12, "the node off once its hosts ended")
    recovered = recover_after(cloud, cell, sshd, storage)
    assert "restoring the snapshot its hosts took at the preemption notice" in recovered.stdout, recovered.stdout
    assert "restored x, step, n onto v4-16 (2 hosts)" in recovered.stdout, recovered.stdout
    assert "armed: on a preemption notice" in recovered.stdout  # armed again, to a new place
    back = cell("%%on_tpu\nimport numpy as np\n"
                "(n, all(bool((np.asarray(s.data) == step).all()) for s in x.addressable_shards), step > 0)")
    assert back.error is None and "Out[0-1]: (5, True, True)" in back.shown, back.shown
    # a new slice of the same shape: host 0 reads the entry from gs:// (a hit); host 1 looks up its own key
    assert cache_use(cell) == [(["cache_hits", "compile_requests_use_cache"], [key0]),
                               (["compile_requests_use_cache"], [key1])]
    made = cell("%tpu_snapshot n step")  # no --to: the bucket named by TPUNB_BUCKET
    assert made.error is None and "gs://snaps/tpunb-snapshots/spotty/2" in made.stdout, made.shown
    assert cell("%%on_tpu\nn = 0").error is None
    again = cell("%tpu_restore n")  # no place: the newest snapshot of this slice
    assert again.error is None and "restored n onto v4-16 (2 hosts)" in again.stdout, again.shown
    assert "Out[0-1]: 5" in cell("%%on_tpu\nn").shown
    listed = cell("%tpu_status")
    assert listed.error is None and "snapshots" in listed.shown, listed.shown
    assert "gs://snaps/tpunb-snapshots/spotty/preempt-" in listed.shown and "KiB" in listed.shown, listed.shown

    # a snapshot that cannot finish in the window: the last complete one comes back, and the line says why
    slow = cell("%%on_tpu\nimport time\nclass Slow:\n    def __reduce__(self):\n        time.sleep(60)\n"
                "        return (Slow, ())\nslow = Slow()")
    assert slow.error is None, slow.shown
    assert cell("%tpu_snapshot --on-preempt n,slow").error is None
    late = recover_after(cloud, cell, sshd, storage, notice=3.0)
    assert "the snapshot taken at the preemption notice did not finish within the window, so the last complete one" \
        in late.stdout, late.stdout
    assert "restored n, step onto v4-16" in late.stdout, late.stdout  # the snapshot made with %tpu_snapshot

    # no notice at all: the last complete snapshot comes back, and the line says why
    again = recover_after(cloud, cell, sshd, storage, notice=0)
    assert "no snapshot was taken at the preemption (no notice reached the hosts), so the last complete one" \
        in again.stdout, again.stdout
    cell("%tpu_down spotty")
