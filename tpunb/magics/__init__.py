"""Every IPython magic tpunb has, in one room above the Python API it calls: a magic parses its line
(``args``), makes one call into the API and renders the answer, so nothing below imports a magic.

``core`` has the slice magics; ``planning``, ``snapshots``, ``hangs`` and ``benchmark`` one topic each."""
from __future__ import annotations


def register(ipython) -> None:
    """Register every magic class with ``ipython`` (``%load_ext tpunb``)."""
    from tpunb.magics.benchmark import BenchMagics
    from tpunb.magics.core import TpuMagics
    from tpunb.magics.hangs import HangMagics
    from tpunb.magics.planning import PlanMagics
    from tpunb.magics.snapshots import SnapshotMagics

    for magics in (TpuMagics, PlanMagics, SnapshotMagics, HangMagics, BenchMagics):
        ipython.register_magics(magics)
