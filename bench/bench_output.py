"""Output at volume: 2 hosts each print N differing lines in one %%on_tpu cell.

Run: python bench/bench_output.py [--lines 1000000] [--repeat 3] [--baseline-tree DIR]

Each run is a fresh kernel process (a real IPython shell with %load_ext tpunb, a local v4-16
slice, the notebook's stdout captured): the time until the cell returns, lines per second into
the hosts' logs (every line counted in the log files), the kernel's peak RSS growth during the
cell (psutil, sampled every 20 ms) and the size of what the notebook received. Side by side:

- ``--baseline-tree DIR``: the same cell with the tpunb found in DIR (e.g. the tree before this
  change: ``git archive <commit> tpunb | tar -x -C DIR``);
- "just bytes": the same loop as 2 plain Python processes at once, their stdout piped to this
  process, which copies it to files: the floor for moving these lines from 2 processes to disk.
Runs alternate between the contenders, so load from elsewhere hits them alike.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LOOP = 'for i in range({n}):\n    print(i, "x" * 20)'


def child(lines: int) -> None:
    """One measurement in this (fresh) process; prints a JSON line."""
    import contextlib
    import io
    import threading

    import psutil
    from IPython.testing.globalipapp import start_ipython

    import tpunb
    from tpunb import manager

    shell = start_ipython()
    shell.run_cell("%load_ext tpunb")
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        sl = manager.launch("v4-16", name="bench-output")
    sink = io.StringIO()
    kernel = psutil.Process()
    before = peak = kernel.memory_info().rss
    done = threading.Event()

    def watch() -> None:
        nonlocal peak
        while not done.wait(0.02):
            peak = max(peak, kernel.memory_info().rss)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    started = time.perf_counter()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        shell.run_cell_magic("on_tpu", "", LOOP.format(n=lines))
    seconds = time.perf_counter() - started
    done.set()
    watcher.join()
    logged = []
    for host in range(2):
        with open(sl.cell_logs.path(host), "rb") as f:
            logged.append(sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b"")) - 2)
    print(json.dumps({"seconds": seconds, "logged": logged, "rss_growth": peak - before,
                      "notebook_bytes": len(sink.getvalue().encode()), "tpunb": tpunb.__file__}))
    manager.down("bench-output")


def run_tree(tree: str, lines: int, home: str) -> dict:
    env = {**os.environ, "PYTHONPATH": tree, "TPUNB_HOME": tempfile.mkdtemp(dir=home)}
    out = subprocess.run([sys.executable, __file__, "--child", "--lines", str(lines)], env=env, cwd=tree,
                         capture_output=True, text=True, check=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    assert result["tpunb"].startswith(str(Path(tree).resolve())), result["tpunb"]
    assert result["logged"] == [lines, lines], f"lines missing from the logs: {result['logged']}"
    return result


def run_bytes(lines: int, home: str) -> dict:
    """The floor: 2 plain Python processes printing the same lines into pipes, which this process
    copies to files (tpunb's path without frames, labels, display or tail)."""
    import threading

    def copy(proc: subprocess.Popen, path: str) -> None:
        with open(path, "wb") as f:
            for chunk in iter(lambda: proc.stdout.read1(1 << 20), b""):
                f.write(chunk)

    paths = [os.path.join(home, f"plain-{i}.log") for i in range(2)]
    started = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-c", LOOP.format(n=lines)], stdout=subprocess.PIPE) for _ in paths]
    copiers = [threading.Thread(target=copy, args=(p, path)) for p, path in zip(procs, paths)]
    for thread in copiers:
        thread.start()
    for proc, thread in zip(procs, copiers):
        proc.wait()
        thread.join()
    seconds = time.perf_counter() - started
    logged = [Path(path).read_bytes().count(b"\n") for path in paths]
    assert logged == [lines, lines]
    return {"seconds": seconds, "logged": logged, "rss_growth": 0, "notebook_bytes": 0}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--baseline-tree", default=None, help="a tpunb tree to compare with (e.g. the previous commit)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.lines)
        return
    home = tempfile.mkdtemp(prefix="tpunb-bench-output-")
    here = str(Path(__file__).resolve().parent.parent)
    contenders = {"tpunb (this tree)": lambda: run_tree(here, args.lines, home),
                  "just bytes (2 processes piped to files)": lambda: run_bytes(args.lines, home)}
    if args.baseline_tree:
        contenders["tpunb (baseline tree)"] = lambda: run_tree(args.baseline_tree, args.lines, home)
    runs: dict[str, list[dict]] = {name: [] for name in contenders}
    for _ in range(args.repeat):
        for name, run in contenders.items():
            runs[name].append(run())
    total = 2 * args.lines
    ours = statistics.median(r["seconds"] for r in runs["tpunb (this tree)"])
    print(f"2 hosts x {args.lines:,} differing lines, median of {args.repeat} (load average "
          f"{os.getloadavg()[0]:.1f})\n")
    print("| contender | time to cell return (s) | lines/s into the logs | kernel peak RSS growth (MB) "
          "| notebook output (kB) | time / tpunb's |")
    print("|---|---|---|---|---|---|")
    for name, results in runs.items():
        seconds = statistics.median(r["seconds"] for r in results)
        rss = statistics.median(r["rss_growth"] for r in results) / 1e6
        notebook = statistics.median(r["notebook_bytes"] for r in results) / 1e3
        print(f"| {name} | {seconds:.2f} | {total / seconds:,.0f} | {rss:.0f} | {notebook:.0f} | {seconds / ours:.2f}x |")


if __name__ == "__main__":
    main()
