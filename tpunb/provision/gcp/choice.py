"""Which Google API makes a slice, chosen once: at launch from ``--api`` or the type's default
(TPU7x, v6e and v5p through Compute Engine, the others through the Cloud TPU API), and for a
recorded slice from its record's ``api`` (none: the Cloud TPU API, as records before Compute
Engine were). Every member of the ``gcp`` backend asks its slice's handler; nothing else in tpunb
asks which API.

A handler is a module with the same verbs: ``plan`` (a launch checked and prepared, whose
``make`` (create, wait, hosts) and ``reach`` the launch driver runs), ``attach``, ``delete``,
``state``, ``gone``, ``replace_gone``, ``adopt``, ``recover``, ``survey`` (with ``surveyed``:
whether a status view asks it) and ``delete_orphan``. The backend asks both handlers' surveys at
once (tpunb/provision/gcp/__init__.py), so one status view waits for the slower API only.
"""
from __future__ import annotations

from types import ModuleType

from tpunb import catalog
from tpunb.provision.gcp import compute, tpu
from tpunb.provision.gcp.config import CloudOptions
from tpunb.registry import SliceRecord

#: by the ``api`` a record holds
HANDLERS: dict[str, ModuleType] = {tpu.API: tpu, compute.API: compute}


def of(record: SliceRecord) -> ModuleType:
    """The handler of a recorded slice."""
    return HANDLERS[record.spec.get("api") or tpu.API]


def for_launch(accelerator: catalog.Accelerator, opts: CloudOptions) -> ModuleType:
    """The handler a launch of ``accelerator`` goes through (a type the chosen API cannot make: one line)."""
    return compute if compute.uses_compute(accelerator, opts) else tpu


def in_order() -> list[ModuleType]:
    """Every handler, the one asked first first (a slice no record holds is looked for in each)."""
    return list(HANDLERS.values())
