"""Work counted, not timed: Python calls a trivial cell and a first cloud launch make, for comparing trees.

Run: python bench/bench_calls.py [--cells 300]   (or through bench_trees.py, on two trees)

Timings on a shared 2-core machine move by 5-10% between runs; a count of calls does not. Two rows:
1. a trivial ``%%on_tpu`` cell on 4 local hosts, in a real IPython shell: the kernel's Python calls
   per cell (cProfile) and the bytecodes it executes per cell (``sys.settrace`` with opcode events),
   in the thread that runs the cell;
2. a first Compute Engine launch (v5p-8, one instance) in a process that has made one Cloud TPU
   launch, on the sandbox: every thread's calls of tpunb's own functions (``threading.setprofile``)
   and the modules it imports.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import cProfile
import io
import os
import pstats
import sys
import tempfile
import threading


def cell_calls(cells: int) -> tuple[float, float]:
    """(Python calls per cell, bytecodes per cell) of ``%%on_tpu pass`` on 4 local hosts."""
    from IPython.testing.globalipapp import start_ipython

    from tpunb import manager

    shell = start_ipython()
    shell.run_cell("%load_ext tpunb")
    manager.launch("v4-32", name="calls4")
    sink = io.StringIO()
    try:
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            for _ in range(50):
                shell.run_cell_magic("on_tpu", "", "pass")
            profile = cProfile.Profile()
            profile.enable()
            for _ in range(cells):
                shell.run_cell_magic("on_tpu", "", "pass")
            profile.disable()
            opcodes = 0

            def tracer(frame, event, arg):
                nonlocal opcodes
                frame.f_trace_opcodes = True
                opcodes += event == "opcode"
                return tracer

            sys.settrace(tracer)
            try:
                for _ in range(cells):
                    shell.run_cell_magic("on_tpu", "", "pass")
            finally:
                sys.settrace(None)
    finally:
        manager.down("calls4")
    return pstats.Stats(profile).total_calls / cells, opcodes / cells


def first_launch_calls() -> tuple[int, int]:
    """(calls of tpunb's own functions, modules imported) in a first Compute Engine launch."""
    try:
        from tpunb.sandbox.box import start_sandbox
    except ImportError:  # a tree before the sandbox's rename
        from tpunb.emulator.sandbox import start_sandbox
    from tpunb import manager

    box = start_sandbox(hosts=6, create_seconds=0.1)
    counts: collections.Counter = collections.Counter()
    ours = os.sep + "tpunb" + os.sep

    def hook(frame, event, arg):
        if event != "call":
            return
        name = frame.f_code.co_filename
        if ours in name and not any(f"{ours}{s}{os.sep}" in name for s in ("sandbox", "emulator")):
            counts["calls"] += 1
        elif frame.f_code.co_name == "_find_and_load":
            counts["imports"] += 1

    sink = io.StringIO()
    try:
        with contextlib.redirect_stderr(sink), contextlib.redirect_stdout(sink):
            manager.launch("v5p-8", name="first-tpu", zone="us-east5-a", api="tpu", no_setup=True)
            manager.down("first-tpu")
            threading.setprofile(hook)
            sys.setprofile(hook)
            try:
                manager.launch("v5p-8", name="first-compute", zone="us-east5-a", api="compute", no_setup=True)
            finally:
                sys.setprofile(None)
                threading.setprofile(None)
            manager.down("first-compute")
    finally:
        box.stop()
    return counts["calls"], counts["imports"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=300)
    args = parser.parse_args()
    os.environ.setdefault("TPUNB_HOME", tempfile.mkdtemp(prefix="tpunb-bench-"))
    per_cell, opcodes = cell_calls(args.cells)
    calls, imports = first_launch_calls()
    print("| work | count |\n|---|---|")
    print(f"| trivial cell, 4 local hosts: Python calls per cell | {per_cell:.0f} |")
    print(f"| trivial cell, 4 local hosts: bytecodes executed per cell | {opcodes:.0f} |")
    print(f"| first Compute Engine launch (v5p-8): calls of tpunb's functions | {calls} |")
    print(f"| first Compute Engine launch (v5p-8): modules imported (Google's Compute Engine client) | {imports} |")


if __name__ == "__main__":
    main()
