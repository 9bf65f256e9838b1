"""Cloud TPU slices: the launch flow, and the cloud side of a slice (its node's state, a
preemption watch, its cost, its end), and the project's view for %tpu_status (orphans).

A CloudNode is attached to a Slice whose hosts are a Cloud TPU node. Before each cell the
Slice asks ``check()``: if the node was preempted or terminated, the cell fails with a line that
says so and what to do, instead of a confusing SSH error. A background thread refreshes the
state every ``TPUNB_WATCH_INTERVAL`` seconds (30 by default) so that a preemption is noticed
(and said once) even while nobody runs a cell.
"""
from __future__ import annotations

import os
import re
import sys
import threading
import time
from typing import Any

from tpunb import backends, catalog
from tpunb.errors import CellInterrupted, ProvisionError, TpunbError, UsageError
from tpunb.provision import gcp
from tpunb.registry import HostRecord, Registry, SliceRecord
from tpunb.slice import Slice

FRESH_SECONDS = 10.0  # a state this recent is trusted before a cell without asking the API again


def price_per_hour(accelerator: catalog.Accelerator, spot: bool) -> float | None:
    """The slice's list price, or None for a generation without a public one."""
    try:
        return accelerator.price_per_hour(spot)
    except TpunbError:
        return None


def watch_interval() -> float:
    return float(os.environ.get("TPUNB_WATCH_INTERVAL", "30"))


class CloudNode:
    """One node (or queued resource) in one project and zone, watched while the slice is attached."""

    def __init__(self, name: str, accelerator: str, project: str, zone: str, spot: bool,
                 info: gcp.NodeInfo | None = None, watch: bool = True) -> None:
        self.name, self.project, self.zone, self.spot = name, project, zone, spot
        self.accelerator = catalog.lookup(accelerator)
        self.info = info
        self.checked_at = time.monotonic() if info is not None else 0.0
        self._reported = False
        self._stop = threading.Event()
        if watch:
            threading.Thread(target=self._watch, daemon=True, name=f"tpunb-watch-{name}").start()

    @property
    def price_per_hour(self) -> float | None:
        return price_per_hour(self.accelerator, self.spot)

    def refresh(self) -> gcp.NodeInfo | None:
        self.info = gcp.get(self.project, self.zone, self.name)
        self.checked_at = time.monotonic()
        return self.info

    def lost_reason(self) -> str | None:
        """Why the node's hosts are gone for good (preempted, deleted...), or None if they are not."""
        info = self.info
        if info is None:
            return f"its node {self.name} no longer exists in {self.project}/{self.zone}"
        if info.lost:
            state = info.state or info.queued_state
            why = " (spot capacity was reclaimed)" if self.spot and state == "PREEMPTED" else ""
            return f"its node is {state}{why}"
        return None

    def check(self) -> None:
        """Before a cell: raise ProvisionError if the node is gone; ask the API if the state is stale."""
        if time.monotonic() - self.checked_at > FRESH_SECONDS:
            try:
                self.refresh()
            except ProvisionError:
                return  # the API is unreachable: let the cell try the hosts themselves
        reason = self.lost_reason()
        if reason:
            self._reported = True
            raise ProvisionError(f"slice {self.name} cannot run cells: {reason}. Relaunch it with "
                                 f"%tpu_launch --recover {self.name}, or delete it with %tpu_down {self.name}")

    def _watch(self) -> None:
        while not self._stop.wait(watch_interval()):
            try:
                self.refresh()
            except Exception:  # a passing API error: try again next round
                continue
            reason = self.lost_reason()
            if reason and not self._reported:
                self._reported = True
                print(f"[tpunb] slice {self.name}: {reason}. %tpu_launch --recover {self.name} relaunches it; "
                      f"%tpu_down {self.name} deletes it", file=sys.stderr, flush=True)

    def status(self) -> dict:
        info = self.info
        uptime = info.uptime() if info is not None else None
        return {"cloud_state": (info.state or info.queued_state) if info else "GONE",
                "health": info.health if info else None,
                "uptime_s": round(uptime, 1) if uptime is not None else None,
                "usd_per_hour": self.price_per_hour}

    def close(self) -> None:
        self._stop.set()

    def delete(self) -> None:
        """Delete the node (and its queued resource) and wait until it is gone; idempotent."""
        self.close()
        gcp.delete(self.project, self.zone, self.name, wait=True)


GCP_OPTIONS = ("project", "zone", "spot", "runtime", "queued", "network", "subnetwork", "service_account",
               "labels", "internal_ip", "timeout", "user", "python", "connect_wait")


def parse_labels(labels: str | dict | None) -> dict[str, str]:
    """'team=ml,run=7' -> {'team': 'ml', 'run': '7'}."""
    if not labels:
        return {}
    if isinstance(labels, dict):
        return {str(k): str(v) for k, v in labels.items()}
    out = {}
    for pair in labels.split(","):
        key, sep, value = pair.partition("=")
        if not sep or not re.fullmatch(r"[a-z][-_a-z0-9]{0,62}", key.strip()):
            raise UsageError(f"--labels takes k=v,k=v with lowercase keys, got {pair!r}")
        out[key.strip()] = value.strip()
    return out


def launch(accel: catalog.Accelerator, name: str, values: dict[str, str], reg: Registry, **options: Any) -> Slice:
    """Create a Cloud TPU node, wait for READY with progress, connect to every worker over SSH.
    Whatever fails or is interrupted after the node exists deletes it again."""
    import getpass

    from tpunb import keys
    from tpunb.transport.ssh import forget_host_key
    from tpunb.widgets.launch import LaunchProgress

    unknown = set(options) - set(GCP_OPTIONS)
    if unknown:
        raise UsageError(f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(sorted(unknown))} for backend gcp")
    project, zone = gcp.require_project_zone(options.get("project"), options.get("zone"))
    catalog.check_zone(accel, zone)
    key_path, public_key = keys.default_key()
    user = options.get("user") or getpass.getuser()
    spot, queued, internal_ip = bool(options.get("spot")), bool(options.get("queued")), bool(options.get("internal_ip"))
    labels = parse_labels(options.get("labels"))
    spec = gcp.NodeSpec(name=name, accelerator=accel.name, project=project, zone=zone, runtime=options.get("runtime"),
                        spot=spot, queued=queued, network=options.get("network"),
                        subnetwork=options.get("subnetwork"), service_account=options.get("service_account"),
                        labels=labels, internal_ip=internal_ip, ssh_user=user, ssh_public_key=public_key)
    record = SliceRecord(name=name, accelerator=accel.name, backend="gcp", state="creating", owner_pid=os.getpid(),
                         spec={"project": project, "zone": zone, "spot": spot, "queued": queued,
                               "runtime": options.get("runtime"), "network": options.get("network"),
                               "subnetwork": options.get("subnetwork"),
                               "service_account": options.get("service_account"), "labels": labels,
                               "internal_ip": internal_ip, "user": user, "key": str(key_path),
                               "python": options.get("python") or "python3", "env_keys": sorted(values)})
    reg.save_slice(record)  # before anything exists: even a crashed kernel leaves a trace to clean up
    kind = "queued resource" if queued else "node"
    price = price_per_hour(accel, spot)
    progress = LaunchProgress(f"Launching {accel.name} {'spot ' if spot else ''}{kind} {name!r} in {project}/{zone} "
                              f"(backend gcp)", price)
    started = time.perf_counter()
    try:
        info = gcp.create(spec, on_state=progress.state, timeout=options.get("timeout") or gcp.DEFAULT_TIMEOUT)
    except KeyboardInterrupt:
        reg.delete_slice(name)
        message = f"launch of {name} interrupted: what it had created was deleted, nothing is left running"
        progress.failed(message)
        raise CellInterrupted(message) from None
    except BaseException as exc:
        reg.delete_slice(name)
        progress.failed(f"failed: {exc}")
        raise
    sl = None
    try:
        record.hosts = [HostRecord(h.index, h.address(internal_ip) if h.port == 22 else f"{h.address(internal_ip)}:{h.port}",
                                   {"internal_ip": h.internal_ip}) for h in info.hosts]
        for host in info.hosts:  # a new VM has a new host key, even where an old one had its address
            forget_host_key(host.address(internal_ip), host.port, reg)
        record.state = "running"
        sl = backends.ssh_slice(record, reg, values, wait=float(options.get("connect_wait", 180.0)))
        sl.cloud = backends.cloud_node(record, info)
        sl.connect()
        reg.save_slice(record)
    except BaseException as exc:
        if sl is not None:
            sl.close()
        try:
            gcp.delete(project, zone, name, wait=True)
        finally:
            reg.delete_slice(name)
        progress.failed(f"could not connect to the hosts, so {name} was deleted again: {exc}")
        raise
    cost = f"; it costs ${price:,.2f}/hour until %tpu_down {name}" if price is not None else ""
    progress.done(f"Slice {name!r} ready in {time.perf_counter() - started:.1f} s: {len(record.hosts)} host"
                  f"{'s' if len(record.hosts) > 1 else ''}, run cells with %%on_tpu{cost}")
    return sl


def configured_project_zone() -> tuple[str | None, str | None]:
    return gcp.resolve_project_zone(None, None)


def delete_orphan(name: str) -> bool:
    """A tpunb node the registry does not know, in the configured project and zone: delete it."""
    project, zone = configured_project_zone()
    if not (project and zone):
        return False
    info = gcp.get(project, zone, name)
    if info is None or not info.tpunb_owned:
        return False
    return gcp.delete(project, zone, name, wait=True)


def listing(records: list[SliceRecord]) -> dict[tuple[str, str], dict]:
    """One list call per project and zone in use (and the configured one, for orphans)."""
    places = {(r.spec["project"], r.spec["zone"]) for r in records if r.backend == "gcp"}
    project, zone = configured_project_zone()
    if project and zone:
        places.add((project, zone))
    listing = {}
    for place in sorted(places):
        try:
            listing[place] = {info.name: info for info in gcp.list_nodes(*place)}
        except TpunbError as exc:
            print(f"[tpunb] cannot list nodes in {place[0]}/{place[1]}: {exc}", file=sys.stderr)
    return listing
