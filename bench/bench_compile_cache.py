"""The compile cache: the second start of a jitted program in a fresh session (a restarted host),
with the cache against without it, side by side in one run.

Run: python bench/bench_compile_cache.py [--rounds 5] [--layers 24]

Three one-host local slices (v4-8), each in its own $TPUNB_HOME, run the same program: a jitted
``value_and_grad`` of a ``--layers``-deep residual MLP. Its first call is timed on the host (from the
call to the loss being ready: compile, or the cache's read, plus one step), and JAX's monitoring
events say whether the cache was hit. Slices:
- without the cache (``--env JAX_ENABLE_COMPILATION_CACHE=false``);
- the default, a cache on the host's disk;
- ``--compile-cache gs://...`` (Cloud Storage on this machine: gcp-storage-emulator, read and
  written through gcsfs, as on a VM but without the network's latency).
Each slice runs the program once in its first session (the cache empty: compile and write), then
``--rounds`` times after a ``%tpu_restart`` (a fresh Python on the host). Rounds alternate between
the slices, so a busy moment on this shared machine falls on all of them alike.
"""
from __future__ import annotations

import argparse
import ast
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

PROGRAM = """
import time, jax, jax.numpy as jnp
events, compiling = [], []
jax.monitoring.register_event_listener(lambda name, **kw: events.append(name))
jax.monitoring.register_event_duration_secs_listener(
    lambda name, seconds, **kw: compiling.append(seconds) if name == '/jax/core/compile/backend_compile_duration' else None)
def loss(ws, x):
    for w in ws:
        x = jax.nn.gelu(x @ w) + x
    return (x ** 2).mean()
ws = [jnp.full((256, 256), 0.01) for _ in range({layers})]
x = jnp.ones((64, 256))
step = jax.jit(jax.value_and_grad(loss))
events.clear(); compiling.clear()
started = time.perf_counter()
step(ws, x)[0].block_until_ready()
(time.perf_counter() - started, sum(compiling), any(e.endswith('/cache_hits') for e in events))
"""


def first_call(sl, program: str) -> tuple[float, float, bool]:
    """On host 0: seconds to the first result, seconds of it in XLA's compile (or the cache's
    read: JAX times both as its backend compile), and whether JAX read it from the cache."""
    result = sl.run(program, output=None)
    result.raise_for_status()
    return ast.literal_eval(result.reprs[0])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5, help="restarts per slice")
    parser.add_argument("--layers", type=int, default=24, help="depth of the jitted MLP (its compile time)")
    args = parser.parse_args()
    os.environ["TPUNB_HOME"] = tempfile.mkdtemp(prefix="tpunb-bench-cc-")
    from IPython.testing.globalipapp import get_ipython

    import tpunb
    from tpunb.sandbox.storage.cloud_storage import StorageEmulator

    get_ipython().run_cell("%load_ext tpunb")
    program = PROGRAM.format(layers=args.layers)
    with StorageEmulator(("bench-cache",)) as storage:
        os.environ["STORAGE_EMULATOR_HOST"] = storage.url  # local hosts inherit it
        kinds = {"no cache": {"env": ["JAX_ENABLE_COMPILATION_CACHE=false"]},
                 "cache on the host's disk (default)": {},
                 "cache in Cloud Storage (--compile-cache gs://)": {"compile_cache": "gs://bench-cache/jax"}}
        slices = {kind: tpunb.launch("v4-8", name=f"cc-{i}", **options) for i, (kind, options) in enumerate(kinds.items())}
        try:
            first = {kind: first_call(sl, program) for kind, sl in slices.items()}
            again: dict[str, list[tuple[float, float, bool]]] = {kind: [] for kind in slices}
            for _ in range(args.rounds):
                for kind, sl in slices.items():
                    sl.restart()
                    again[kind].append(first_call(sl, program))
        finally:
            tpunb.down(all=True)
    print(f"\n{args.layers}-layer MLP, value_and_grad, jitted; {args.rounds} restarts per slice\n")
    print("| slice | first start (empty cache): s (of it compiling) | second start, after %tpu_restart: median s "
          "(min-max) | of it compiling or reading the cache: median s | cache hits |")
    print("|---|---|---|---|---|")
    for kind in kinds:
        seconds = [s for s, _, _ in again[kind]]
        backend = statistics.median(c for _, c, _ in again[kind])
        hits = sum(hit for _, _, hit in again[kind])
        print(f"| {kind} | {first[kind][0]:.3f} ({first[kind][1]:.3f}) | {statistics.median(seconds):.3f} "
              f"({min(seconds):.3f}-{max(seconds):.3f}) | {backend:.3f} | {hits} of {len(seconds)} |")
    base = statistics.median(s for s, _, _ in again["no cache"])
    for kind in list(kinds)[1:]:
        print(f"\n{kind}: second start {base / statistics.median(s for s, _, _ in again[kind]):.1f}x faster than without")


if __name__ == "__main__":
    main()
