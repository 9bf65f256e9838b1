"""The one adapter between the sidebar's handlers and tpunb's state.

The Jupyter server is not the kernel that owns a slice: it cannot reach the kernel's Slice
objects, only what kernels record in the registry (slices, hosts and their process ids) and
what the Cloud TPU API says. Four functions, plain JSON-ready dicts out:

- ``list_slices()``: every slice (with hosts, state, cost) and orphaned cloud nodes
- ``delete_slice(name)``: end a slice, whoever launched it
- ``stacks(name, hosts)``: where its hosts are (every thread's stack), read from here
- ``catalog()``: what the launch form offers
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any

from tpunb import catalog as _catalog, provision, report, serve, slices
from tpunb.display.hosts import Layout
from tpunb.errors import NoSliceError, OwnedElsewhere  # noqa: F401 - handlers map it to 409
from tpunb.provision.base import Nodes
from tpunb.provision.common import owner_alive, owner_running
from tpunb.registry import Registry, SliceRecord
from tpunb.status import OrphanStatus, SliceStatus


# -- listing ---------------------------------------------------------------------------------

def _host_metrics(latest: list[tuple], host: int, seen: SliceStatus) -> dict[str, float]:
    """The panel's bars as fractions (cpu, memory, hbm) and the raw latest values, from what the
    owning kernel published; the backend says which metrics are a host's CPU and memory."""
    values: dict[str, float] = {}
    for h, metric, _chip, value, _time in latest:
        if h == host and value is not None:
            values[metric] = values.get(metric, 0.0) + value if metric.startswith("hbm_") else value
    bars: dict[str, float] = {}
    cpu = values.get(seen.cpu_metric)
    if cpu is not None:
        bars["cpu"] = min(1.0, cpu / 100)
    used = values.get(seen.memory_metric)
    if used is not None and values.get("memory_total_bytes"):
        bars["memory"] = used / values["memory_total_bytes"]
    if values.get("hbm_used_bytes") is not None and values.get("hbm_total_bytes"):
        bars["hbm"] = values["hbm_used_bytes"] / values["hbm_total_bytes"]
    return {**bars, **values}


def _host_rows(record: SliceRecord, seen: SliceStatus, owner_alive: bool, latest: list[tuple]) -> list[dict[str, Any]]:
    """Each host with the label the notebook gives it ('3', or 's1/0' in a multislice), so the
    panel can group a multislice's hosts by slice and name them as cell output does."""
    layout = Layout(len(record.hosts), record.num_slices)
    return [{"index": host.index, "slice_index": layout.slice_of(host.index), "label": layout.name(host.index),
             "address": host.address, "state": state,
             "metrics": _host_metrics(latest, host.index, seen) if owner_alive else {}}
            for host, state in zip(record.hosts, seen.host_states)]


def _slice_row(record: SliceRecord, now: float, nodes: Nodes, reg: Registry) -> dict[str, Any]:
    owner_alive = owner_running(record)
    seen = provision.backend(record.backend).slice_status(record, nodes)
    usd_per_hour, running_s = seen.usd_per_hour, seen.running_s
    row = {
        "name": record.name, "backend": record.backend, "accelerator": record.kind,
        "num_slices": record.num_slices, "state": seen.state, "created": record.created,
        "age_s": round(now - record.created, 1),
        "spot": bool(record.spec.get("spot")), "usd_per_hour": usd_per_hour,
        "usd_so_far": round(usd_per_hour * running_s / 3600, 4)
        if usd_per_hour is not None and running_s is not None else None,
        "list_usd_per_hour": seen.list_usd_per_hour,
        "idle_delete_in": reg.idle_delete_in(record.name, owner_alive),
        "owner_pid": record.owner_pid,
        "hosts": _host_rows(record, seen, owner_alive, reg.latest_metrics(record.name)),
        "orphan": False,
    }
    serving = _serving(record, usd_per_hour)
    if serving["idle_held"]:
        row["idle_delete_in"] = None  # the watchdog keeps the node while its service runs
    return {**row, **serving}


def _serving(record: SliceRecord, usd_per_hour: float | None) -> dict[str, Any]:
    """The slice's services per host and the forwards live kernels hold (each with its proxy path
    under the server's base URL when jupyter-server-proxy is installed), and which services keep
    the slice busy: while one runs, the idle timer does not delete it and it bills."""
    services = serve.seen.service_rows(record.name, serve.recorded_services(record), usd_per_hour)
    return {"services": [dataclasses.asdict(s) for s in services],
            "forwards": [dataclasses.asdict(f) for f in serve.seen.forward_rows(record.name)],
            "busy_services": sorted({s.service for s in services if s.busy}),
            "idle_held": record.name in serve.seen.kept_busy(services)}


def _orphan_row(orphan: OrphanStatus) -> dict[str, Any]:
    price, uptime = orphan.usd_per_hour, orphan.uptime_s
    return {
        "name": orphan.name, "backend": orphan.backend, "accelerator": orphan.accelerator,
        "num_slices": orphan.num_slices,
        "state": orphan.state, "project": orphan.project, "zone": orphan.zone,
        "age_s": round(uptime, 1) if uptime is not None else None, "spot": orphan.spot, "usd_per_hour": price,
        "usd_so_far": round(price * uptime / 3600, 4) if price is not None and uptime is not None else None,
        "hosts": [], "orphan": True, "message": orphan.message,
    }


def list_slices() -> dict[str, Any]:
    """Every slice the registry knows, newest last, plus tpunb nodes it does not (orphans)."""
    reg = Registry()
    records = reg.list_slices()
    survey = provision.gcp.Survey(records, reg)  # no API call unless a cloud slice or a project is configured
    now = time.time()
    return {"slices": [_slice_row(r, now, survey.nodes, reg) for r in records],
            "orphans": [_orphan_row(o) for o in survey.orphans({r.name for r in records})], "time": now}


# -- delete ------------------------------------------------------------------------------------

def delete_slice(name: str) -> dict[str, Any]:
    """End the slice: a cloud node is deleted (and waited for), a local slice's host processes end,
    and the registry forgets it. An orphan node (in the configured project) is deleted too."""
    reg = Registry()
    record = reg.get_slice(name)
    if record is not None and owner_alive(record):  # another live kernel holds it: its backend ends it from here
        provision.backend(record.backend).delete(record, force=True)
        reg.delete_slice(name)
        return {"deleted": [name], "messages": []}
    with report.captured() as messages:  # what %tpu_down would print goes back to the panel
        deleted = slices.down(name)
    if not deleted:
        raise NoSliceError(f"no slice named {name!r}: it may already be deleted (refresh the list)")
    return {"deleted": deleted, "messages": [m.text for m in messages]}


# -- stacks ------------------------------------------------------------------------------------

def stacks(name: str, hosts: str | None = None, native: bool = False) -> dict[str, Any]:
    """Every chosen host's stacks, grouped as %tpu_stacks prints them, and per host where its main
    thread is; read from this server through the registry while the owning kernel may be busy."""
    from tpunb.hangs.outside import recorded_stacks

    reg = Registry()
    record = reg.get_slice(name)
    if record is None:
        raise NoSliceError(f"no slice named {name!r}: it may have been deleted (refresh the list)")
    found = recorded_stacks(record, reg, hosts or None, native)
    return {"name": name, "text": found.text(), "seconds": round(found.seconds, 3),
            "hosts": {str(h): {"where": s.where, "error": s.error, "state": s.state} for h, s in found.items()}}


# -- launch form -------------------------------------------------------------------------------

def catalog() -> dict[str, Any]:
    """Accelerator names and zones for the launch form's completion, and the default backend."""
    return {"accelerators": _catalog.names(), "zones": _catalog.zones(), "backends": list(provision.LAUNCH_BACKENDS),
            "default_backend": provision.default_backend()}
