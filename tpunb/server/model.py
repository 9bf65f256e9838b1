"""The one adapter between the sidebar's handlers and tpunb's state.

The Jupyter server is not the kernel that owns a slice: it cannot reach the kernel's Slice
objects, only what kernels record in the registry (slices, hosts and their process ids) and
what the Cloud TPU API says. Four functions, plain JSON-ready dicts out:

- ``list_slices()``: every slice (with hosts, state, cost) and orphaned cloud nodes, from the
  one status model %tpu_status renders too
- ``delete_slice(name)``: end a slice, whoever launched it; answers with the fresh listing
- ``stacks(name, hosts)``: where its hosts are (every thread's stack), read from here
- ``catalog()``: what the launch form offers
"""
from __future__ import annotations

from typing import Any

from tpunb import catalog as _catalog, provision, report, manager
from tpunb.errors import NoSliceError, OwnedElsewhere  # noqa: F401 - handlers map it to 409
from tpunb.provision.common import owner_alive
from tpunb.registry import Registry
from tpunb.overview import StatusView


# -- listing ---------------------------------------------------------------------------------

def list_slices() -> dict[str, Any]:
    """Every slice the registry knows, newest last, plus tpunb nodes it does not (orphans): the
    status view (``tpunb.overview``) as JSON, the same model %tpu_status renders."""
    return StatusView.build(Registry()).to_json()


# -- delete ------------------------------------------------------------------------------------

def delete_slice(name: str) -> dict[str, Any]:
    """End the slice: a cloud node is deleted (and waited for), a local slice's host processes end,
    and the registry forgets it. An orphan node (in the configured project) is deleted too. The
    answer is the fresh view (``list_slices()`` after the delete), so the sidebar redraws from it,
    with what was deleted and what %tpu_down would have printed."""
    reg = Registry()
    record = reg.get_slice(name)
    if record is not None and owner_alive(record):  # another live kernel holds it: its backend ends it from here
        provision.backend(record.backend).delete(record, force=True)
        reg.delete_slice(name)
        return {**list_slices(), "deleted": [name], "messages": []}
    with report.captured() as messages:  # what %tpu_down would print goes back to the panel
        deleted = manager.down(name)
    if not deleted:
        raise NoSliceError(f"no slice named {name!r}: it may already be deleted (refresh the list)")
    return {**list_slices(), "deleted": deleted, "messages": [m.text for m in messages]}


# -- stacks ------------------------------------------------------------------------------------

def stacks(name: str, hosts: str | None = None, native: bool = False) -> dict[str, Any]:
    """Every chosen host's stacks, grouped as %tpu_stacks prints them, and per host where its main
    thread is; read from this server through the registry while the owning kernel may be busy."""
    from tpunb.server.outside import recorded_stacks

    reg = Registry()
    record = reg.get_slice(name)
    if record is None:
        raise NoSliceError(f"no slice named {name!r}: it may have been deleted (refresh the list)")
    found = recorded_stacks(record, reg, hosts or None, native)
    return {"name": name, "text": found.text(), "seconds": round(found.seconds, 3),
            "hosts": {str(h): {"where": s.where, "error": s.error, "state": s.state} for h, s in found.items()}}


# -- launch form -------------------------------------------------------------------------------

def catalog() -> dict[str, Any]:
    """Accelerator names and zones for the launch form's completion, every backend as the sidebar
    shows it (``provision.describe``: the panel names none itself), and the default backend."""
    launchable = [n for n in _catalog.names() if not _catalog.lookup(n).planning_only]
    return {"accelerators": launchable, "zones": _catalog.zones(), "backends": provision.describe(),
            "default_backend": provision.default_backend()}
