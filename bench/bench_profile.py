"""What %%tpu_profile costs on a 2-host v4-16 local simulated slice (real multi-process JAX on CPU).

Run: python bench/bench_profile.py [--runs 5] [--steps 20] [--xprof-python /path/to/python]

1. Wall time of a cell running a data-parallel jitted step 20 times (an all-reduce across the two
   hosts each step), through the magics in a real IPython shell: `%%on_tpu` vs `%%tpu_profile`,
   alternated, median of ``--runs``; the ratio profiled / unprofiled.
2. The time from the cell's end on the hosts (Slice.run returns) to the view shown (the magic
   has stopped the profiler on both hosts, each host has summarised its trace, the files came back
   over the agent and were unpacked, and the HTML view was rendered), with its parts.
3. For comparison, xprof's own conversion of the same xplane files (``xspace_to_tool_data``) into
   its trace viewer and framework op stats, when a Python with xprof is given (xprof is an extra).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

SETUP = """import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
mesh = Mesh(np.array(jax.devices()), ('data',))
w = jax.device_put(jnp.ones((256, 256)) * 0.01, NamedSharding(mesh, P()))
local = np.random.default_rng(jax.process_index()).normal(size=(256, 256)).astype('float32')
xs = jax.make_array_from_process_local_data(NamedSharding(mesh, P('data')), local)
@jax.jit
def train_step(w, x):
    loss, grad = jax.value_and_grad(lambda w: jnp.mean(jnp.tanh(x @ w) ** 2))(w)
    return w - 0.1 * grad, loss
w, loss = train_step(w, xs)
float(loss)
"""
STEPS = """for _ in range({steps}):
    w, loss = train_step(w, xs)
float(loss)
"""

XPROF = r"""
import json, sys, time
from xprof.convert import raw_to_tool_data
paths = sys.argv[1:]
out = {}
for tool in ("trace_viewer@", "framework_op_stats"):
    started = time.perf_counter()
    data, _ = raw_to_tool_data.xspace_to_tool_data(paths, tool, {})
    out[tool] = time.perf_counter() - started
print(json.dumps(out))
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--xprof-python", default=None, help="a Python that has xprof, for its conversion time")
    args = parser.parse_args()
    os.environ.setdefault("TPUNB_HOME", tempfile.mkdtemp(prefix="tpunb-bench-"))

    from IPython.testing.globalipapp import start_ipython

    import tpunb
    from tpunb import manager
    from tpunb.profile import view

    shell = start_ipython()
    shell.run_cell("%load_ext tpunb")
    formatter = shell.display_formatter  # a notebook renders HTML; a terminal shell does not
    formatter.active_types = [*formatter.active_types, "text/html"]
    formatter.formatters["text/html"].enabled = True
    sl = manager.launch("v4-16", name="bench-profile")
    marks: dict = {}
    real_run, real_render = sl.run, view.render

    def run(*a, **kw):  # the moment the cell is over on every host
        marks["cell_start"] = time.perf_counter()
        try:
            return real_run(*a, **kw)
        finally:
            marks["cell_end"] = time.perf_counter()

    def render(profile):
        started = time.perf_counter()
        try:
            return real_render(profile)
        finally:
            marks["render_s"] = time.perf_counter() - started

    sl.run = run
    view.render = render

    def cell(code: str) -> float:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            from IPython.utils.capture import capture_output

            with capture_output():
                started = marks["magic_start"] = time.perf_counter()
                result = shell.run_cell(code)
                ended = time.perf_counter()
        if not result.success:
            raise SystemExit(f"cell failed: {result.error_in_exec or result.error_before_exec}")
        marks["shown"] = ended
        return ended - started

    try:
        cell("%%on_tpu\n" + SETUP)
        steps = STEPS.format(steps=args.steps)
        cell("%%on_tpu\n" + steps)  # warm up both paths
        cell("%%tpu_profile\n" + steps)
        plain, profiled, after, summarise, render_s, stop_trace, before, inside = [], [], [], [], [], [], [], []
        for _ in range(args.runs):
            plain.append(cell("%%on_tpu\n" + steps))
            profiled.append(cell("%%tpu_profile\n" + steps))
            after.append(marks["shown"] - marks["cell_end"])
            before.append(marks["cell_start"] - marks["magic_start"])
            inside.append(marks["cell_end"] - marks["cell_start"])
            profile = tpunb.last_profile()
            summarise.append(max(s["summarize_s"] for s in profile.summaries.values()))
            render_s.append(marks["render_s"])
            stop_trace.append(max(s["stop_trace_s"] for s in profile.summaries.values()))
        calls = profile.events[profile.events["name"] == "PjitFunction(train_step)"].groupby("host").size().to_dict()
        total_events = sum(s["total_events"] for s in profile.summaries.values())
        size = sum(f.stat().st_size for f in profile.path.rglob("*") if f.is_file())
        med = statistics.median
        print(f"hosts 0-1, {args.steps} steps per cell, {args.runs} runs (median); train_step calls per host: {calls}")
        print(f"| unprofiled cell (%%on_tpu) | {med(plain) * 1e3:.1f} ms |")
        print(f"| profiled cell (%%tpu_profile), cell to view shown | {med(profiled) * 1e3:.1f} ms |")
        print(f"| ratio profiled / unprofiled | {med(profiled) / med(plain):.2f}x |")
        print(f"| starting the profiler on both hosts | {med(before) * 1e3:.1f} ms |")
        print(f"| the cell itself while recording | {med(inside) * 1e3:.1f} ms |")
        print(f"| cell's end on the hosts to the view shown | {med(after) * 1e3:.1f} ms |")
        print(f"|   of which: jax.profiler.stop_trace writing the files (slowest host) | {med(stop_trace) * 1e3:.1f} ms |")
        print(f"|   of which: summarising on the host (slowest host) | {med(summarise) * 1e3:.1f} ms |")
        print(f"|   of which: rendering the view | {med(render_s) * 1e3:.1f} ms |")
        print(f"| trace: events over both hosts, files kept | {total_events:,} events, {size / 1e3:.0f} kB |")
        if args.xprof_python:
            xplanes = [str(p) for p in sorted(profile.path.glob("host-*/plugins/profile/*/*.xplane.pb"))]
            out = subprocess.run([args.xprof_python, "-c", XPROF, *xplanes], capture_output=True, text=True)
            if out.returncode:
                print("xprof failed:", out.stderr.strip().splitlines()[-1:])
            else:
                for tool, seconds in json.loads(out.stdout.strip().splitlines()[-1]).items():
                    print(f"| xprof xspace_to_tool_data({tool!r}) of the same 2 files | {seconds * 1e3:.1f} ms |")
    finally:
        sl.delete()


if __name__ == "__main__":
    main()
