"""Starting a local simulated slice: agents forked from the kernel's fork server, against fresh
host processes (``TPUNB_FORK_SERVER=0``, as before it) and ipyparallel's local engines, in one run.

Run: python bench/bench_local_start.py [--repeat 5] [--hosts 4,16] [--engines 4,16]

For each size, the three take turns ``--repeat`` times, after one untimed round (the first launch
of the run also starts the fork server):
- tpunb: ``manager.launch(ACCEL)`` until every host's agent is ready, then a trivial cell on all;
- tpunb, fresh processes: the same with ``TPUNB_FORK_SERVER=0`` (each agent a new Python that
  imports IPython's shell);
- ipyparallel: ``Cluster(n=N).start_and_connect_sync()`` and ``wait_for_engines(N)``, then
  ``view.apply_sync(lambda: None)`` on all (its engines import ipykernel's).
Each is ended (``Slice.delete()``, ``stop_cluster_sync()``) before the next starts, untimed. CPU is the
machine's busy time during the start (/proc/stat): agents are not all the kernel's children.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

#: hosts -> the v4 accelerator that has that many (4 chips a host, 2 TensorCores a chip)
ACCELERATORS = {1: "v4-8", 2: "v4-16", 4: "v4-32", 8: "v4-64", 16: "v4-128", 32: "v4-256"}


def busy_seconds() -> float:
    with open("/proc/stat") as stat:
        fields = stat.readline().split()
    return sum(int(fields[i]) for i in (1, 2, 3, 6, 7)) / os.sysconf("SC_CLK_TCK")


def measured(start, stop) -> tuple[float, float]:
    """(wall s, busy CPU s) of ``start()``; ``stop(what start returned)`` after, untimed."""
    cpu, wall = busy_seconds(), time.perf_counter()
    made = start()
    wall, cpu = time.perf_counter() - wall, busy_seconds() - cpu
    stop(made)
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--hosts", default="4,16", help="slice sizes, in hosts")
    parser.add_argument("--engines", default="4,16", help="sizes ipyparallel is timed at too ('' for none)")
    args = parser.parse_args()
    os.environ.setdefault("TPUNB_HOME", tempfile.mkdtemp(prefix="tpunb-bench-"))
    os.environ["TPUNB_STANDBY"] = "0"  # nothing starts behind a slice while the next one is timed
    import ipyparallel

    from tpunb import manager

    def tpunb_start(hosts: int, forked: bool):
        def start():
            os.environ["TPUNB_FORK_SERVER"] = "1" if forked else "0"
            sl = manager.launch(ACCELERATORS[hosts], name=f"start-{hosts}")
            result = sl.run("pass", output=None)
            assert result.ok, result
            return sl
        return start

    def ipp_start(engines: int):
        def start():
            cluster = ipyparallel.Cluster(n=engines, log_level=40)
            client = cluster.start_and_connect_sync()
            client.wait_for_engines(engines, timeout=300)
            client[:].apply_sync(lambda: None)
            return cluster, client
        return start

    def ipp_stop(made) -> None:
        cluster, client = made
        client.close()
        cluster.stop_cluster_sync()

    engine_sizes = {int(n) for n in args.engines.split(",") if n}
    rows = []
    for hosts in [int(n) for n in args.hosts.split(",")]:
        sides = {"tpunb (fork server)": (tpunb_start(hosts, True), lambda sl: sl.delete()),
                 "tpunb, fresh processes": (tpunb_start(hosts, False), lambda sl: sl.delete())}
        if hosts in engine_sizes:
            sides["ipyparallel"] = (ipp_start(hosts), ipp_stop)
        for start, stop in sides.values():  # untimed: the fork server starts, caches warm
            measured(start, stop)
        samples = {name: [] for name in sides}
        for _ in range(args.repeat):
            for name, (start, stop) in sides.items():
                samples[name].append(measured(start, stop))
        medians = {name: (statistics.median(w for w, _ in s), statistics.median(c for _, c in s))
                   for name, s in samples.items()}
        ours = medians["tpunb (fork server)"]
        for name, (wall, cpu) in medians.items():
            rows.append((f"{hosts} hosts: {name}", f"{wall * 1e3:.0f} ms", f"{cpu:.2f} s",
                         "-" if name.startswith("tpunb (") else f"{wall / ours[0]:.1f}x"))
        print(f"  {hosts} hosts done", file=sys.stderr, flush=True)
    print(f"\nStarting a local slice until a trivial cell ran on every host (median of {args.repeat})\n")
    print("| what | wall | machine CPU | wall / tpunb's |")
    print("|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
