"""tpunb: Cloud TPU slices native to Jupyter.

``%load_ext tpunb`` registers the magics; the same things are plain functions here:
``launch``, ``connect``, ``use``, ``current``, ``down``, ``status``, ``plan``.
"""
from __future__ import annotations

from tpunb.errors import TpunbError
from tpunb.plan import plan
from tpunb.profile import last_profile
from tpunb.slice import Slice
from tpunb.slices import connect, current, down, last_result, launch, status, use

__version__ = "0.1.0"
__all__ = ["launch", "connect", "use", "current", "down", "status", "last_result", "last_profile", "plan", "Slice", "TpunbError"]


def load_ipython_extension(ipython) -> None:
    from tpunb.magics import TpuMagics
    from tpunb.plan.magics import PlanMagics

    ipython.register_magics(TpuMagics)
    ipython.register_magics(PlanMagics)


def unload_ipython_extension(ipython) -> None:
    from tpunb import slices

    slices.detach_all()
