"""tpunb: Cloud TPU slices native to Jupyter.

``%load_ext tpunb`` registers the magics; the same things are plain functions here:
``launch``, ``connect``, ``use``, ``current``, ``down``, ``status``, ``plan``, ``doctor``, ``bench_serving``.
"""
from __future__ import annotations

import sys

from tpunb.doctor import doctor
from tpunb.provision import warm
from tpunb.errors import TpunbError, UsageError
from tpunb.plan import plan
from tpunb.serve.bench import bench_serving
from tpunb.slice import Slice
from tpunb.manager import connect, current, down, last_profile, last_result, last_run, launch, secret, status, use

__version__ = "0.1.0"
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
    from tpunb.stuck.magics import HangMagics
    from tpunb.magics import TpuMagics
    from tpunb.plan.magics import PlanMagics
    from tpunb.serve.magics import BenchMagics
    from tpunb.snapshot.magics import SnapshotMagics

    ipython.register_magics(TpuMagics)
    ipython.register_magics(PlanMagics)
    ipython.register_magics(SnapshotMagics)
    ipython.register_magics(HangMagics)
    ipython.register_magics(BenchMagics)
    warm.start()  # what a launch imports, on a side thread where Ctrl-C cannot cut it


def unload_ipython_extension(ipython) -> None:
    from tpunb import manager

    manager.detach_all()
