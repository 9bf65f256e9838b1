"""A small push to 4 local hosts, timed per push: ``{'x': 1, 'a': np.arange(1000)}`` (8 KB,
inside the request frame), p50 and p90 over blocks, plus the kernel's CPU per push.

It imports tpunb from ``PYTHONPATH`` (it never puts its own checkout first), so one copy of it
times any tree: ``bench/bench_trees.py`` runs it against two trees alternately in one run, and
it is what found where the push's 0.04 ms came from (BENCHMARKS.md).

    PYTHONPATH=TREE python bench/bench_small_push.py [--pushes 2000] [--hosts 4]
"""
from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pushes", type=int, default=2000)
    parser.add_argument("--hosts", type=int, default=4)
    args = parser.parse_args()
    import numpy as np

    import tpunb
    from tpunb import slices

    value = {"x": 1, "a": np.arange(1000)}
    accelerator = {1: "v4-8", 2: "v4-16", 4: "v4-32", 8: "v4-64"}[args.hosts]
    sl = slices.launch(accelerator, name="bench-small-push")
    hosts = list(range(args.hosts))
    try:
        for _ in range(200):
            sl.session.push(value, hosts)
        walls, cpu = [], time.process_time()
        for _ in range(args.pushes):
            started = time.perf_counter()
            sl.session.push(value, hosts)
            walls.append(time.perf_counter() - started)
        cpu = (time.process_time() - cpu) / args.pushes
    finally:
        slices.down("bench-small-push")
    walls.sort()
    print(f"\n### Small push ({tpunb.__file__.rsplit('/tpunb/', 1)[0]})\n")
    print("| what | p50 ms | p90 ms | kernel CPU ms |")
    print("|---|---|---|---|")
    print(f"| push {{'x': 1, 'a': np.arange(1000)}} to {args.hosts} local hosts | {statistics.median(walls) * 1e3:.3f} "
          f"| {walls[int(len(walls) * 0.9)] * 1e3:.3f} | {cpu * 1e3:.3f} |")


if __name__ == "__main__":
    main()
