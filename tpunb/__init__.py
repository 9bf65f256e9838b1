"""tpunb: Cloud TPU slices native to Jupyter.

``%load_ext tpunb`` registers the magics; the same things are plain functions here:
``launch``, ``connect``, ``use``, ``current``, ``down``, ``status``, ``plan``, ``doctor``, ``bench_serving``.
"""
from __future__ import annotations

import functools
import sys

from tpunb.magics.checkup import doctor
from tpunb.provision import warm
from tpunb.errors import TpunbError, UsageError
from tpunb.plan import plan
from tpunb import bench
from tpunb.slice import Slice
from tpunb.manager import connect, current, down, last_profile, last_result, last_run, launch, secret, status, use

__version__ = "0.1.0"


@functools.wraps(bench.bench_serving)
def bench_serving(target: str, *args, **options) -> bench.BenchResult:
    options.setdefault("current", current)  # a service TARGET is found on the current (or named) slice
    return bench.bench_serving(target, *args, **options)

__all__ = ["launch", "connect", "use", "current", "down", "status", "secret", "last_result", "last_run", "last_profile", "log",
           "plan", "doctor", "bench_serving", "Slice", "TpunbError"]


def log(step: int | None = None, **scalars: float) -> None:
    """In a ``%%on_tpu`` cell: record your own metrics on this host (``tpunb.log(step, loss=l)``);
    they stream to ``%tpu_metrics`` and ``Slice.metrics()``. Costs microseconds per call."""
    host = sys.modules.get("tpunb_host.metrics")  # the agent's sampler, on a slice's host
    if host is None:
        raise UsageError("tpunb.log records metrics on a slice's hosts: call it inside a %%on_tpu cell")
    host.log(step, **scalars)


def load_ipython_extension(ipython) -> None:
    from tpunb import magics

    magics.register(ipython)
    warm.start()  # what a launch imports, on a side thread where Ctrl-C cannot cut it


def unload_ipython_extension(ipython) -> None:
    from tpunb import manager

    manager.detach_all()
