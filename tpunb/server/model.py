"""The one adapter between the sidebar's handlers and tpunb's state.

The Jupyter server is not the kernel that owns a slice: it cannot reach the kernel's Slice
objects, only what kernels record in the registry (slices, hosts and their process ids) and
what the Cloud TPU API says. Three functions, plain JSON-ready dicts out:

- ``list_slices()``: every slice (with hosts, state, cost) and orphaned cloud nodes
- ``delete_slice(name)``: end a slice, whoever launched it
- ``catalog()``: what the launch form offers
"""
from __future__ import annotations

import os
import signal
import time
from typing import Any

from tpunb import catalog as _catalog, provision, report, slices
from tpunb.host import procs
from tpunb.display.hosts import Layout
from tpunb.errors import NoSliceError, TpunbError
from tpunb.provision.common import owner_running, pid_alive
from tpunb.provision.gcp.node import price_per_hour
from tpunb.registry import Registry, SliceRecord

HOST_EXIT_SECONDS = 10.0  # how long delete waits for a host process to end after SIGTERM, then SIGKILL


class OwnedElsewhere(TpunbError):
    """The slice belongs to a live kernel and its hosts cannot be ended from here."""


# -- listing ---------------------------------------------------------------------------------

def _price(accelerator: str, spot: bool) -> float | None:
    try:
        return price_per_hour(_catalog.lookup(accelerator), spot)
    except TpunbError:
        return None


def _list_price(record: SliceRecord, spot: bool) -> float | None:
    """What the slice (every slice of a multislice) would cost on Cloud TPU."""
    price = _price(record.accelerator, spot) if record.accelerator else None
    return price * record.num_slices if price is not None else None


def _host_metrics(latest: list[tuple], host: int, backend: str) -> dict[str, float]:
    """The panel's bars as fractions (cpu, memory, hbm) and the raw latest values, from what the
    owning kernel published. A simulated host shares this machine, so its own process is shown."""
    values: dict[str, float] = {}
    for h, metric, _chip, value, _time in latest:
        if h == host and value is not None:
            values[metric] = values.get(metric, 0.0) + value if metric.startswith("hbm_") else value
    bars: dict[str, float] = {}
    cpu = values.get("process_cpu_percent" if backend == "local" else "cpu_percent")
    if cpu is not None:
        bars["cpu"] = min(1.0, cpu / 100)
    used = values.get("rss_bytes" if backend == "local" else "memory_used_bytes")
    if used is not None and values.get("memory_total_bytes"):
        bars["memory"] = used / values["memory_total_bytes"]
    if values.get("hbm_used_bytes") is not None and values.get("hbm_total_bytes"):
        bars["hbm"] = values["hbm_used_bytes"] / values["hbm_total_bytes"]
    return {**bars, **{k: v for k, v in values.items()}}


def _host_rows(record: SliceRecord, owner_alive: bool, latest: list[tuple]) -> list[dict[str, Any]]:
    """Each host with the label the notebook gives it ('3', or 's1/0' in a multislice), so the
    panel can group a multislice's hosts by slice and name them as cell output does."""
    layout = Layout(len(record.hosts), record.num_slices)
    rows = []
    for host in record.hosts:
        pid = host.info.get("pid")
        if record.backend == "local":
            state = "running" if owner_alive and (pid is None or pid_alive(pid)) else "gone"
        else:
            state = "connected" if owner_alive else "not connected"
        rows.append({"index": host.index, "slice_index": layout.slice_of(host.index),
                     "label": layout.name(host.index), "address": host.address, "state": state,
                     "metrics": _host_metrics(latest, host.index, record.backend) if owner_alive else {}})
    return rows


def _slice_row(record: SliceRecord, now: float, nodes: dict, reg: Registry) -> dict[str, Any]:
    owner_alive = owner_running(record)
    spot = bool(record.spec.get("spot"))
    if record.backend == "local":
        state = "running" if owner_alive else "stopped: its kernel ended (%tpu_use restarts it)"
        usd_per_hour: float | None = 0.0  # simulated on this machine: free
        running_s = now - record.created
    elif record.backend == "gcp":
        info = nodes.get((record.spec.get("project"), record.spec.get("zone")), {}).get(record.name)
        state = (info.state or info.queued_state or "UNKNOWN") if info else record.state
        usd_per_hour = _list_price(record, spot)
        uptime = info.uptime() if info else None
        running_s = uptime if uptime is not None else now - record.created
    else:
        state = "connected" if owner_alive else "not connected (%tpu_use reconnects)"
        usd_per_hour, running_s = None, now - record.created
    return {
        "name": record.name, "backend": record.backend, "accelerator": record.kind,
        "num_slices": record.num_slices, "state": state, "created": record.created,
        "age_s": round(now - record.created, 1),
        "spot": spot, "usd_per_hour": usd_per_hour,
        "usd_so_far": round(usd_per_hour * running_s / 3600, 4) if usd_per_hour is not None else None,
        "list_usd_per_hour": _list_price(record, spot),
        "idle_delete_in": reg.idle_delete_in(record.name, owner_alive),
        "owner_pid": record.owner_pid, "hosts": _host_rows(record, owner_alive, reg.latest_metrics(record.name)),
        "orphan": False,
    }


def _orphan_rows(nodes: dict, known: set[str]) -> list[dict[str, Any]]:
    rows = []
    for (project, zone), infos in sorted(nodes.items()):
        for name, info in sorted(infos.items()):
            if name in known or not info.tpunb_owned:
                continue
            price = _price(info.accelerator, info.spot)
            price = price * info.slices if price is not None else None  # every node of a multislice
            uptime = info.uptime()
            rows.append({
                "name": name, "backend": "gcp", "accelerator": info.kind, "num_slices": info.slices,
                "state": info.state or info.queued_state or "UNKNOWN", "project": project, "zone": zone,
                "age_s": round(uptime, 1) if uptime is not None else None, "spot": info.spot,
                "usd_per_hour": price,
                "usd_so_far": round(price * uptime / 3600, 4) if price is not None and uptime is not None else None,
                "hosts": [], "orphan": True,
                "message": "not in this registry and still billed: delete it here or with %tpu_down " + name,
            })
    return rows


def list_slices() -> dict[str, Any]:
    """Every slice the registry knows, newest last, plus tpunb nodes it does not (orphans)."""
    reg = Registry()
    records = reg.list_slices()
    nodes = provision.gcp.Survey(records).nodes  # no API call unless a cloud slice or a project is configured
    now = time.time()
    return {"slices": [_slice_row(r, now, nodes, reg) for r in records],
            "orphans": _orphan_rows(nodes, {r.name for r in records}), "time": now}


# -- delete ------------------------------------------------------------------------------------

def _end_hosts(record: SliceRecord) -> None:
    """End a local slice's host processes that its (live) kernel started: each is its own process
    group. Only processes whose parent is still the owner are signalled, never a reused pid."""
    pids = [h.info.get("pid") for h in record.hosts]
    if not all(pids):
        raise OwnedElsewhere(f"local slice {record.name!r} runs in another kernel (pid {record.owner_pid}) "
                             f"that did not publish its host processes: %tpu_down {record.name} there")
    mine = [pid for pid in pids if procs.parent(pid) == record.owner_pid]
    for sig, wait in ((signal.SIGTERM, HOST_EXIT_SECONDS), (signal.SIGKILL, HOST_EXIT_SECONDS)):
        for pid in mine:
            try:
                os.killpg(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + wait
        while mine and time.monotonic() < deadline:
            mine = [pid for pid in mine if procs.parent(pid) == record.owner_pid]  # a zombie has ended
            if mine:
                time.sleep(0.05)  # polling the processes' state, not a guessed delay
        if not mine:
            return
    raise TpunbError(f"host processes {mine} of {record.name!r} did not end; kill them, then %tpu_down {record.name}")


def delete_slice(name: str) -> dict[str, Any]:
    """End the slice: a cloud node is deleted (and waited for), a local slice's host processes end,
    and the registry forgets it. An orphan node (in the configured project) is deleted too."""
    reg = Registry()
    record = reg.get_slice(name)
    if record is not None and record.backend == "local" and record.owner_pid != os.getpid() \
            and owner_running(record):
        _end_hosts(record)
        reg.delete_slice(name)
        return {"deleted": [name], "messages": []}
    with report.captured() as messages:  # what %tpu_down would print goes back to the panel
        deleted = slices.down(name)
    if not deleted:
        raise NoSliceError(f"no slice named {name!r}: it may already be deleted (refresh the list)")
    return {"deleted": deleted, "messages": [m.text for m in messages]}


# -- launch form -------------------------------------------------------------------------------

def catalog() -> dict[str, Any]:
    """Accelerator names and zones for the launch form's completion, and the default backend."""
    return {"accelerators": _catalog.names(), "zones": _catalog.zones(), "backends": list(provision.LAUNCH_BACKENDS),
            "default_backend": provision.default_backend()}
