"""A small push to 4 local hosts, timed per push: ``{'x': 1, 'a': np.arange(1000)}`` (8 KB,
inside the request frame). Pushes run in blocks; per block the median wall time and the CPU per
push of the kernel's thread that pushes are taken, and the host processes' CPU over all pushes.
Printed: the median and p90 over all pushes, the best block's median (on a loaded machine, close
to what a quiet one shows), the pushing thread's CPU per push (the least of the blocks: CPU a
loaded machine only adds to), the whole kernel's and the hosts' (over all pushes).

Then the kernel's own cost, without host processes: a session whose hosts answer each request
at once, in this process (each frame still encoded as for real hosts), so the time is the kernel's
code alone (pickling, the request, its wait loop), on this thread's CPU clock, the least of 9
repeats: the same on a loaded machine as on a quiet one. Pushes and trivial cells, 4 and 64 hosts.

It imports tpunb from ``PYTHONPATH`` (it never puts its own checkout first), so one copy of it
times any tree: ``bench/bench_trees.py`` runs it against two trees alternately in one run, and
it is what found where the push's 0.04 ms came from (BENCHMARKS.md).

    PYTHONPATH=TREE python bench/bench_small_push.py [--pushes 3000] [--block 100] [--hosts 4]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (/proc/PID/stat fields 14 and 15)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def kernel_alone(hosts: int, value: dict) -> tuple[float, float]:
    """Microseconds of the kernel's code per push and per trivial cell, hosts answering at once."""
    import timeit

    from tpunb.engine import wire as frames
    from tpunb.engine.session import Session
    from tpunb.transport.pipes import LocalTransport

    session = Session([LocalTransport(f"local:{i}") for i in range(hosts)], lambda i: {})
    encode = frames.Broadcast.for_host
    frames.Broadcast.for_host = lambda self, host: (encode(self, host), self.message)[1]
    for host in session.hosts:
        host.alive, host.info, host.fast = True, {"pid": 1}, True

        def answer(message, host=host):
            if message.get("op") in ("exec", "push"):
                session._route(host.index, {"op": "done", "id": message["id"], "status": "ok"}, b"")
        host.send_frame = answer
    every = list(range(hosts))

    def best(run) -> float:
        return min(timeit.repeat(run, number=2000, repeat=9, timer=time.thread_time)) / 2000 * 1e6

    try:
        return best(lambda: session.push(value, every)), best(lambda: session.execute("pass", every))
    finally:
        frames.Broadcast.for_host = encode


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pushes", type=int, default=3000)
    parser.add_argument("--block", type=int, default=100)
    parser.add_argument("--hosts", type=int, default=4)
    args = parser.parse_args()
    import numpy as np

    import tpunb
    from tpunb import manager

    value = {"x": 1, "a": np.arange(1000)}
    accelerator = {1: "v4-8", 2: "v4-16", 4: "v4-32", 8: "v4-64"}[args.hosts]
    sl = manager.launch(accelerator, name="bench-small-push")
    hosts = list(range(args.hosts))
    pids = [h.info["pid"] for h in sl.session.hosts]
    walls, medians, cpus = [], [], []
    try:
        for _ in range(200):
            sl.session.push(value, hosts)
        host_cpu, kernel_cpu = sum(map(cpu_seconds, pids)), time.process_time()
        for _ in range(max(1, args.pushes // args.block)):
            block, cpu = [], time.thread_time()
            for _ in range(args.block):
                started = time.perf_counter()
                sl.session.push(value, hosts)
                block.append(time.perf_counter() - started)
            cpus.append((time.thread_time() - cpu) / args.block)
            medians.append(statistics.median(block))
            walls += block
        host_cpu = (sum(map(cpu_seconds, pids)) - host_cpu) / len(walls)
        kernel_cpu = (time.process_time() - kernel_cpu) / len(walls)
    finally:
        manager.down("bench-small-push")
    walls.sort()
    print(f"\n### Small push\n\ntpunb from {tpunb.__file__.rsplit('/tpunb/', 1)[0]}; {len(walls)} pushes in blocks "
          f"of {args.block}\n")
    print("| what | p50 ms | p90 ms | best block's p50 ms | pushing thread's CPU ms | kernel's CPU ms | hosts' CPU ms |")
    print("|---|---|---|---|---|---|---|")
    print(f"| push {{'x': 1, 'a': np.arange(1000)}} to {args.hosts} local hosts | {statistics.median(walls) * 1e3:.3f} "
          f"| {walls[int(len(walls) * 0.9)] * 1e3:.3f} | {min(medians) * 1e3:.3f} | {min(cpus) * 1e3:.4f} "
          f"| {kernel_cpu * 1e3:.3f} | {host_cpu * 1e3:.3f} |")

    kernel = {n: kernel_alone(n, value) for n in (4, 64)}
    print("\n### The kernel's code alone (hosts answering at once, in process)\n")
    print("| what | 4 hosts, us | 64 hosts, us |")
    print("|---|---|---|")
    print(f"| push {{'x': 1, 'a': np.arange(1000)}} | {kernel[4][0]:.1f} | {kernel[64][0]:.1f} |")
    print(f"| trivial cell | {kernel[4][1]:.1f} | {kernel[64][1]:.1f} |")


if __name__ == "__main__":
    main()
