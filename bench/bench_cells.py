"""Cell latency and streaming throughput of %%on_tpu on local simulated slices.

Run: python bench/bench_cells.py [--runs 500]

1. A trivial cell (`pass`) on a 4-host slice, through the magic in a real IPython shell, side by
   side with ipyparallel's `%%px --block pass` on 4 local engines in the same shell and run; and
   the same cell on 4 hosts reached over SSH (a real OpenSSH sshd on loopback addresses); and the
   same cell with ``--bg`` (returns a handle at once; timed until its handle says it is done).
2. The same trivial cell on a 64-host slice (v4-512), no host importing JAX.
3. Streaming: 4 hosts each print 50,000 lines; every line must arrive (checked), lines/s overall.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered) * 1e3, ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1e3


def time_cells(run, runs: int, warmup: int = 20) -> list[float]:
    for _ in range(warmup):
        run()
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        run()
        samples.append(time.perf_counter() - started)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=500)
    args = parser.parse_args()
    os.environ.setdefault("TPUNB_HOME", tempfile.mkdtemp(prefix="tpunb-bench-"))

    from IPython.testing.globalipapp import start_ipython
    import ipyparallel as ipp
    import tpunb
    from tpunb import manager

    shell = start_ipython()
    shell.run_cell("%load_ext tpunb")
    sink = io.StringIO()

    # 1. 4 hosts: tpunb vs ipyparallel, same shell, same run
    manager.launch("v4-32", name="bench4")
    with contextlib.redirect_stderr(sink), contextlib.redirect_stdout(sink):
        tpunb_4 = time_cells(lambda: shell.run_cell_magic("on_tpu", "", "pass"), args.runs)
        tpunb_4_bg = time_cells(lambda: shell.run_cell_magic("on_tpu", "--bg", "pass").wait(), args.runs)
    cluster = ipp.Cluster(n=4, log_level=40)
    client = cluster.start_and_connect_sync()
    client.wait_for_engines(4)
    client.activate()  # registers %%px in this shell
    with contextlib.redirect_stderr(sink), contextlib.redirect_stdout(sink):
        ipp_4 = time_cells(lambda: shell.run_cell_magic("px", "--block", "pass"), args.runs)
    client.close()
    cluster.stop_cluster_sync()
    manager.down("bench4")

    # 1b. 4 hosts over SSH (real OpenSSH sshd on 4 loopback addresses)
    from tpunb.sandbox.hosts.sshd import Sshd, write_ed25519

    server = Sshd(hosts=4)
    key = os.path.join(os.environ["TPUNB_HOME"], "bench_key")
    server.authorize(write_ed25519(Path(key)))
    manager.connect([f"{a}:{server.port}" for a in server.addresses], key=key, python=server.python, name="ssh4")
    with contextlib.redirect_stderr(sink), contextlib.redirect_stdout(sink):
        tpunb_ssh = time_cells(lambda: shell.run_cell_magic("on_tpu", "", "pass"), args.runs)
    manager.down("ssh4")
    server.close()

    # 2. 64 hosts, none importing JAX
    started = time.perf_counter()
    manager.launch("v4-512", name="bench64")
    launch_64 = time.perf_counter() - started
    with contextlib.redirect_stderr(sink), contextlib.redirect_stdout(sink):
        tpunb_64 = time_cells(lambda: shell.run_cell_magic("on_tpu", "", "pass"), max(100, args.runs // 5))
    manager.down("bench64")

    # 3. streaming 4 x 50,000 lines through the notebook display path (capped) and the logs
    sl = manager.launch("v4-32", name="stream4")
    lines = 50_000
    code = f"import os\nh = os.environ['TPUNB_HOST_INDEX']\nfor i in range({lines}):\n    print('host', h, 'line', i)"
    with contextlib.redirect_stderr(sink), contextlib.redirect_stdout(sink):
        started = time.perf_counter()
        result = sl.run(code)
        elapsed = time.perf_counter() - started
    received = {h: r.stdout.count("\n") for h, r in result.items()}
    complete = all(n == lines for n in received.values()) and all(
        r.stdout.endswith(f"line {lines - 1}\n") for r in result.values())
    manager.down("stream4")

    p50_t4, p99_t4 = percentiles(tpunb_4)
    p50_i4, p99_i4 = percentiles(ipp_4)
    p50_t64, p99_t64 = percentiles(tpunb_64)
    rate = 4 * lines / elapsed
    print(f"\nPython {sys.version.split()[0]}, {os.cpu_count()} cores, tpunb {tpunb.__version__}, "
          f"ipyparallel {ipp.__version__}, {args.runs} runs\n")
    print("| benchmark | tpunb p50 | tpunb p99 | peer p50 | peer p99 | ratio (peer p50 / tpunb p50) | target |")
    print("|---|---|---|---|---|---|---|")
    print(f"| trivial cell, 4 hosts vs ipyparallel %%px --block, 4 engines | {p50_t4:.2f} ms | {p99_t4:.2f} ms | "
          f"{p50_i4:.2f} ms | {p99_i4:.2f} ms | {p50_i4 / p50_t4:.1f}x | p50 <= 3 ms, >= 5x |")
    p50_b, p99_b = percentiles(tpunb_4_bg)
    print(f"| trivial cell with --bg, 4 hosts, until its handle is done, vs the same in the foreground | "
          f"{p50_b:.2f} ms | {p99_b:.2f} ms | {p50_t4:.2f} ms | {p99_t4:.2f} ms | +{p50_b - p50_t4:.2f} ms | "
          "no measurable cost |")
    p50_s, p99_s = percentiles(tpunb_ssh)
    print(f"| trivial cell, 4 hosts over SSH (real sshd on loopback) | {p50_s:.2f} ms | {p99_s:.2f} ms | - | - | - | "
          "p50 <= 5 ms |")
    print(f"| trivial cell, 64 hosts (v4-512, no JAX) | {p50_t64:.2f} ms | {p99_t64:.2f} ms | - | - | - | p50 <= 25 ms |")
    print(f"| streaming 4 x {lines:,} lines | {rate:,.0f} lines/s ({elapsed:.2f} s) | all lines arrived: "
          f"{complete} | - | - | - | >= 50,000 lines/s |")
    print(f"\n(64-host slice launch took {launch_64:.1f} s)")
    if not complete:
        raise SystemExit(f"lines lost: {received}")


if __name__ == "__main__":
    main()
