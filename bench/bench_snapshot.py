"""%tpu_snapshot and %tpu_restore against orbax's own CheckpointManager, and the time from a
preemption notice to a complete snapshot (issue 31).

Run: python bench/bench_snapshot.py [--mb 256] [--runs 5] [--notice-mb 1024] [--skip-notice] [--skip-throughput]

1. Throughput, side by side in one run, on a local simulated v4-32 (4 host processes, 16 JAX CPU
   devices): one global jax.Array of ``--mb`` MiB (float32, sharded P('x') over the 16 devices)
   saved to and restored from a local folder by ``tpunb.snapshot`` (what the magics call), and by
   orbax's ``CheckpointManager`` run as a cell on the same hosts (``save`` + ``wait_until_finished``,
   then ``restore`` with the same target sharding). Both are timed from the kernel, cell to cell;
   after one warm-up of each, alternated, median of ``--runs``; the ratio is orbax's time / tpunb's (>= 1: tpunb is as fast).
2. Notice to complete snapshot: a spot v4-32 on the Cloud TPU API emulator (4 real sshd hosts on
   this machine, each with its metadata server), armed with --snapshot-on-preempt for a
   ``--notice-mb`` MiB global array, to a local folder; the node is preempted with a 120 s notice,
   once with the hosts idle and once in a training loop that calls tpunb.log every step. The time
   from the notice (the emulator flips the metadata, sends SIGTERM and stops the hosts' sshd
   sessions, so the hosts go on without the kernel) to manifest.json on disk.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

MAKE = """import jax, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
mesh = jax.make_mesh((jax.device_count(),), ('x',))
rows = {rows}
w = jax.make_array_from_callback((rows, 1024), NamedSharding(mesh, P('x')),
                                 lambda i: np.random.default_rng(i[0].start or 0).random((i[0].stop - i[0].start, 1024), np.float32))
w.block_until_ready()
step = 0
"""
ORBAX_SAVE = """import orbax.checkpoint as ocp
mngr = ocp.CheckpointManager({path!r})
mngr.save({step}, args=ocp.args.StandardSave({{'w': w}}))
mngr.wait_until_finished()
mngr.close()
"""
ORBAX_RESTORE = """import orbax.checkpoint as ocp
mngr = ocp.CheckpointManager({path!r})
target = {{'w': jax.ShapeDtypeStruct(w.shape, w.dtype, sharding=w.sharding)}}
w2 = mngr.restore({step}, args=ocp.args.StandardRestore(target))['w']
w2.block_until_ready()
mngr.close()
del w2
"""
TRAIN = """import time, tpunb
add = jax.jit(lambda a: a + 1)
for _ in range(100000):
    w = add(w)
    step += 1
    tpunb.log(step, loss=1.0 / step)
    time.sleep(0.02)
"""


def timed(fn) -> float:
    began = time.perf_counter()
    fn()
    return time.perf_counter() - began


def throughput(mb: int, runs: int) -> dict:
    import tpunb
    from tpunb import snapshot

    sl = tpunb.launch("v4-32", name="bench-snap")
    work = Path(tempfile.mkdtemp(prefix="tpunb-bench-snap-"))
    try:
        rows = mb * 2**20 // (4 * 1024)
        sl.run(MAKE.format(rows=rows), output=None).raise_for_status()
        results: dict[str, list[float]] = {"tpunb save": [], "orbax save": [], "tpunb restore": [], "orbax restore": []}
        snapshot.snapshot(sl, ["w"], to=str(work / "warm"))  # imports (orbax on every host) and first compiles
        snapshot.restore(sl, str(work / "warm"), ["w"])
        sl.run(ORBAX_SAVE.format(path=str(work / "warm-orbax"), step=0), output=None).raise_for_status()
        sl.run(ORBAX_RESTORE.format(path=str(work / "warm-orbax"), step=0), output=None).raise_for_status()
        for run in range(runs):
            target = work / f"tpunb-{run}"
            results["tpunb save"].append(timed(lambda: snapshot.snapshot(sl, ["w"], to=str(target))))
            results["orbax save"].append(timed(lambda: sl.run(ORBAX_SAVE.format(path=str(work / "orbax"), step=run),
                                                              output=None).raise_for_status()))
            results["tpunb restore"].append(timed(lambda: snapshot.restore(sl, str(target), ["w"])))
            results["orbax restore"].append(timed(lambda: sl.run(ORBAX_RESTORE.format(path=str(work / "orbax"), step=run),
                                                                 output=None).raise_for_status()))
        medians = {k: statistics.median(v) for k, v in results.items()}
        return {"mb": mb, "runs": runs, "seconds": results, "median": medians,
                "save ratio (orbax/tpunb)": medians["orbax save"] / medians["tpunb save"],
                "restore ratio (orbax/tpunb)": medians["orbax restore"] / medians["tpunb restore"],
                "tpunb save MB/s": mb / medians["tpunb save"], "orbax save MB/s": mb / medians["orbax save"],
                "tpunb restore MB/s": mb / medians["tpunb restore"], "orbax restore MB/s": mb / medians["orbax restore"]}
    finally:
        sl.delete()
        shutil.rmtree(work, ignore_errors=True)  # every run's snapshot and orbax checkpoint: gigabytes


def notice_to_snapshot(mb: int) -> dict:
    import tpunb
    from tpunb.sandbox.box import start_sandbox
    from tpunb.snapshot import preempt

    sandbox = start_sandbox(hosts=4, create_seconds=0.2)
    out = {}
    try:
        for case in ("idle", "training"):
            work = Path(tempfile.mkdtemp(prefix="tpunb-bench-notice-"))
            sl = tpunb.launch("v4-32", name="bench-spot", spot=True)
            try:
                rows = mb * 2**20 // (4 * 1024)
                sl.run(MAKE.format(rows=rows), output=None).raise_for_status()
                uri = preempt.arm(sl, ["w", "step"], to=str(work / "notice"))
                runner = None
                if case == "training":
                    runner = threading.Thread(target=lambda: sl.run(TRAIN, output=None), daemon=True)
                    runner.start()
                    while len(sl.metrics().query("metric == 'loss'")) < 8:  # every host is stepping
                        time.sleep(0.1)
                began = time.time()
                sandbox.preempt("bench-spot", notice=120.0)
                manifest = Path(uri) / "manifest.json"
                while not manifest.exists() and time.time() - began < 120:
                    time.sleep(0.01)  # polling a file another process writes  # noqa: bench
                out[case] = {"seconds": time.time() - began if manifest.exists() else None,
                             "size": json.loads(manifest.read_text())["size"] if manifest.exists() else None}
            finally:
                sl.delete()
    finally:
        sandbox.stop()
    return {"mb": mb, "hosts": 4, **out}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=256)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--notice-mb", type=int, default=1024)
    parser.add_argument("--skip-notice", action="store_true")
    parser.add_argument("--skip-throughput", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("TPUNB_HOME", tempfile.mkdtemp(prefix="tpunb-bench-home-"))
    report = {}
    if not args.skip_throughput:
        report["throughput"] = throughput(args.mb, args.runs)
        print(json.dumps(report["throughput"], indent=1), flush=True)
    if not args.skip_notice:
        report["notice"] = notice_to_snapshot(args.notice_mb)
        print(json.dumps(report["notice"], indent=1), flush=True)


if __name__ == "__main__":
    main()
