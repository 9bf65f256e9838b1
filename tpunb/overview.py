"""One status view model per slice, built one way for everyone who shows status.

``%tpu_status`` renders it as a DataFrame (``StatusView.frame``), the Jupyter server as JSON
(``StatusView.to_json``), and the JupyterLab sidebar reads that JSON: the same numbers by
construction. A slice's view holds its hosts (state, process, latest metrics with chips combined
one way: bytes summed, percentages averaged), its cost, services, forwards and idle timer; the
whole view also holds the cloud nodes no record knows (orphans) and the snapshots this machine
knows. ``%tpu_serve``'s listing is a slice's services from here too.

The cost rule (``usd_so_far``), the idle rule (``idle_delete_in``) and which services keep a slice
busy (``BUSY``) are written here only: tests/test_layout.py keeps them from being computed elsewhere.

A slice this process holds (``attached``) is seen live (its hosts' agents, its metrics ring, its
node); any other one as its owning kernel last recorded it in the registry.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

from tpunb import provision
from tpunb.display.hosts import Layout
from tpunb.provision.common import owner_running
from tpunb.services import recorded_services, seen
from tpunb.status import ForwardRow, HostRow, OrphanStatus, ServiceRow, SliceStatus, SnapshotRow, frame

if TYPE_CHECKING:
    import pandas

    from tpunb.registry import IdleMark, Registry, SliceRecord
    from tpunb.services.seen import ServiceState
    from tpunb.slice import Slice

#: a service's states that keep its slice busy (and billing): the idle timer does not run
BUSY = ("starting", "running", "restarting")


def usd_so_far(usd_per_hour: float | None, seconds: float | None) -> float | None:
    """The cost rule: what ``seconds`` at ``usd_per_hour`` came to (None when either is unknown)."""
    return round(usd_per_hour * seconds / 3600, 4) if usd_per_hour is not None and seconds is not None else None


def idle_delete_in(mark: IdleMark | None, owner_alive: bool, now: float, held: bool = False) -> float | None:
    """The idle rule: seconds until the slice's watchdog deletes its node if nothing runs. None
    without idle autodelete, or while ``held`` (a service runs, or the watchdog cannot delete); a
    request running in a live kernel keeps the whole limit, a busy slice whose kernel died counts
    from when its request began."""
    if mark is None or not mark.seconds or held:
        return None
    if mark.busy and owner_alive:
        return mark.seconds
    return round(max(0.0, mark.seconds - (now - mark.since)), 1)


def service_rows(slice_name: str, states: list[ServiceState], usd_per_hour: float | None) -> list[ServiceRow]:
    """A slice's services as status rows: a busy one carries the slice's $/h (it keeps it billing)."""
    return [ServiceRow(slice=slice_name, service=s.name, host=s.host, state=seen.describe(s), restarts=s.restarts,
                       exit_code=s.exit_code, pid=s.pid, command=s.command, busy=s.state in BUSY,
                       usd_per_hour=usd_per_hour if s.state in BUSY else None, port=s.port) for s in states]


def forward_rows(slice_name: str) -> list[ForwardRow]:
    """A slice's forwards as status rows; with jupyter-server-proxy installed, each also names its
    path under the Jupyter server's base URL (a link that works from another machine)."""
    proxied = importlib.util.find_spec("jupyter_server_proxy") is not None
    return [ForwardRow(slice=slice_name, **f, proxy=f"proxy/{f['local_port']}/" if proxied else None)
            for f in seen.forwards(slice_name)]


def snapshot_rows(now: float) -> tuple[list[SnapshotRow], str | None]:
    """Every snapshot this machine knows (its folder, the bucket, those written with --to), oldest
    first, and why some could not be listed (a bucket that cannot be read: one line, never a failure)."""
    from tpunb.errors import TpunbError
    from tpunb.host import gcs
    from tpunb.snapshot import places as store

    try:
        found, problem = store.snapshots(), None
    except (TpunbError, gcs.GcsError, OSError, ValueError) as exc:
        found, problem = store.snapshots(gcs_too=False), f"snapshots on Cloud Storage not listed: {exc}"
    return [SnapshotRow(s.slice, ", ".join(s.names), s.shape if s.complete else "", s.size,
                        round(now - s.time, 1) if s.time else None, "gs" if s.uri.startswith("gs://") else "local",
                        s.complete, s.uri) for s in found], problem


def combine(latest: list[tuple]) -> dict[int, dict[str, float]]:
    """{host: {metric: value}} from (host, metric, chip, value, time) rows: a metric reported per
    chip is summed over the chips (bytes add up), or averaged if it is a percentage."""
    values: dict[tuple[int, str], list[float]] = {}
    for host, metric, _chip, value, _time in latest:
        if value is not None:
            values.setdefault((host, metric), []).append(value)
    out: dict[int, dict[str, float]] = {}
    for (host, metric), each in values.items():
        out.setdefault(host, {})[metric] = sum(each) / len(each) if metric.endswith("_percent") else sum(each)
    return out


@dataclass
class HostView:
    """One host: where it is, how it is, and its latest metrics."""

    index: int
    label: str  # as the notebook names it: '3', or 's1/0' in a multislice
    slice_index: int | None  # which slice of a multislice (None: a single slice)
    address: str | None
    state: str  # running, gone, connected, not connected, ...
    pid: int | None = None
    runner: str | None = None
    uptime_s: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)

    def bars(self, seen: SliceStatus) -> dict[str, float]:
        """The sidebar's bars as fractions: the backend says which metrics are a host's CPU and memory."""
        bars, values = {}, self.metrics
        if values.get(seen.cpu_metric) is not None:
            bars["cpu"] = min(1.0, values[seen.cpu_metric] / 100)
        if values.get(seen.memory_metric) is not None and values.get("memory_total_bytes"):
            bars["memory"] = values[seen.memory_metric] / values["memory_total_bytes"]
        if values.get("hbm_used_bytes") is not None and values.get("hbm_total_bytes"):
            bars["hbm"] = values["hbm_used_bytes"] / values["hbm_total_bytes"]
        return bars


@dataclass
class SliceView:
    """One slice as every status view shows it."""

    record: SliceRecord
    seen: SliceStatus  # its backend's wording of its state, and its price
    hosts: list[HostView]
    current: bool = False
    #: held by this process, its hosts seen live (else as its owning kernel last recorded it)
    live: bool = False
    cloud: dict = field(default_factory=dict)  # cloud_state, health, usd_per_hour, uptime_s (cloud slices)
    idle_delete_in: float | None = None  # seconds until its idle watchdog deletes it (None: never)
    services: list[ServiceRow] = field(default_factory=list)
    forwards: list[ForwardRow] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.record.name

    @property
    def usd_per_hour(self) -> float | None:
        return self.cloud.get("usd_per_hour", self.seen.usd_per_hour)

    @property
    def usd_so_far(self) -> float | None:
        return usd_so_far(self.usd_per_hour, self.seen.running_s)

    @property
    def busy_services(self) -> list[str]:
        """Services that run: while one does, the idle watchdog keeps the slice (and it bills)."""
        return sorted({s.service for s in self.services if s.busy})

    def host_rows(self) -> list[HostRow]:
        """%tpu_status's rows: one per host (one for a slice whose hosts are not recorded); a host
        seen live says its own state, one of a slice held elsewhere its slice's."""
        record = self.record
        common = dict(slice=record.name, current=self.current, accelerator=record.kind, backend=record.backend,
                      idle_delete_in=self.idle_delete_in, **{**self.cloud, "usd_per_hour": self.usd_per_hour}
                      if self.cloud else {})
        if not self.hosts:
            return [HostRow(host=None, address=None, state=self.seen.state, **common)]
        return [HostRow(host=h.index, slice_index=h.slice_index, address=h.address,
                        state=h.state if self.live else self.seen.state, pid=h.pid,
                        runner=h.runner, **{"uptime_s": h.uptime_s, **common},
                        **{m: h.metrics.get(m) for m in ("cpu_percent", "rss_bytes", "memory_used_bytes",
                                                         "hbm_used_bytes")})
                for h in self.hosts]

    def to_json(self, now: float) -> dict[str, Any]:
        """The sidebar's card: the slice, its hosts with their bars and raw metrics, services, forwards."""
        record, seen_ = self.record, self.seen
        return {
            "name": record.name, "backend": record.backend, "accelerator": record.kind,
            "num_slices": record.num_slices, "state": seen_.state, "created": record.created,
            "age_s": round(now - record.created, 1), "spot": bool(record.spec.get("spot")),
            "usd_per_hour": self.usd_per_hour, "usd_so_far": self.usd_so_far,
            "list_usd_per_hour": seen_.list_usd_per_hour, "idle_delete_in": self.idle_delete_in,
            "idle_delete_failing": self.cloud.get("idle_delete_failing"),
            "api": self.cloud.get("api"), "machine_type": self.cloud.get("machine_type"),
            "owner_pid": record.owner_pid, "current": self.current, "orphan": False,
            "hosts": [{"index": h.index, "slice_index": h.slice_index or 0, "label": h.label, "address": h.address,
                       "state": h.state, "metrics": {**h.bars(seen_), **h.metrics}} for h in self.hosts],
            "services": [dataclasses.asdict(s) for s in self.services],
            "forwards": [dataclasses.asdict(f) for f in self.forwards],
            "busy_services": self.busy_services, "idle_held": bool(self.busy_services),
        }


def orphan_json(orphan: OrphanStatus) -> dict[str, Any]:
    """An orphaned cloud node as the sidebar shows it."""
    price, uptime = orphan.usd_per_hour, orphan.uptime_s
    return {
        "name": orphan.name, "backend": orphan.backend, "accelerator": orphan.accelerator,
        "num_slices": orphan.num_slices, "state": orphan.state, "project": orphan.project, "zone": orphan.zone,
        "age_s": round(uptime, 1) if uptime is not None else None, "spot": orphan.spot, "usd_per_hour": price,
        "usd_so_far": usd_so_far(price, uptime),
        "hosts": [], "orphan": True, "message": orphan.message,
        "api": orphan.cloud.get("api"), "machine_type": orphan.cloud.get("machine_type"),
    }


@dataclass
class StatusView:
    """Every slice the registry knows, and the cloud nodes it does not (orphans)."""

    slices: list[SliceView]
    orphans: list[OrphanStatus]
    time: float
    snapshots: list[SnapshotRow] = field(default_factory=list)
    snapshots_error: str | None = None  # why snapshots on Cloud Storage are missing, one line

    @classmethod
    def build(cls, reg: Registry, attached: Mapping[str, Slice] | None = None, current: str | None = None,
              ask_services: bool = True, snapshots: bool = True) -> StatusView:
        """The view from the registry, live for the slices in ``attached`` (this kernel's).
        ``ask_services``: an attached slice known to have services is asked for them (a process on
        every host); otherwise services are what its hosts' files or a kernel last listed.
        ``snapshots``: list the snapshots too (this machine's folder, and the bucket if one is named)."""
        attached = attached or {}
        records = reg.list_slices()
        survey = provision.Survey(records, reg)  # no cloud call unless a cloud slice or a project is configured
        views = []
        for record in records:
            sl = attached.get(record.name)
            if sl is not None:
                survey.refresh(record, sl.node)  # one list call refreshes every attached node
            ask = ask_services and sl is not None and bool(seen.listed_services(record.name))
            views.append(_slice_view(record, reg, survey.nodes, sl, record.name == current, ask))
        now = time.time()
        found, problem = snapshot_rows(now) if snapshots else ([], None)
        return cls(views, survey.orphans({r.name for r in records}), now, found, problem)

    @classmethod
    def of_slice(cls, reg: Registry, sl: Slice, current: bool = False) -> SliceView:
        """One attached slice's view, its hosts asked for their services (what %tpu_serve lists);
        no cloud survey: the node's own look."""
        return _slice_view(reg.get_slice(sl.name) or sl.record, reg, {}, sl, current, ask_services=True)

    def host_rows(self) -> list[HostRow]:
        return [row for v in self.slices for row in v.host_rows()] + [o.host_row() for o in self.orphans]

    def frame(self) -> pandas.DataFrame:
        """%tpu_status: one row per host; services, forwards and snapshots in ``.attrs`` (shown below it)."""
        return frame(self.host_rows(), [s for v in self.slices for s in v.services],
                     [f for v in self.slices for f in v.forwards], self.snapshots)

    def to_json(self) -> dict[str, Any]:
        """The server's answer to GET /tpunb/api/slices, which the sidebar reads."""
        return {"slices": [v.to_json(self.time) for v in self.slices],
                "orphans": [orphan_json(o) for o in self.orphans], "time": self.time,
                "snapshots": [dataclasses.asdict(s) for s in self.snapshots], "snapshots_error": self.snapshots_error}


def _slice_view(record: SliceRecord, reg: Registry, nodes: Any, sl: Slice | None, current: bool,
                ask_services: bool) -> SliceView:
    """``ask_services``: ask the hosts of an attached slice for its services (a process on every
    host, which a slice without any must not pay on every status); else what is recorded of them."""
    seen_ = provision.backend(record.backend).slice_status(record, nodes)
    layout = Layout(len(record.hosts), record.num_slices)
    now = time.time()
    if sl is not None:  # held here: live
        metrics = combine(sl.metrics_store.latest_rows())
        hosts = [HostView(h.index, layout.name(h.index), layout.slice_of(h.index) if layout.multislice else None,
                          record.hosts[h.index].address if h.index < len(record.hosts) else h.transport.address,
                          _live_state(h.alive, h.index < len(record.hosts) and record.hosts[h.index].info.needs_restart),
                          h.info.get("pid"), h.info.get("runner"),
                          round(now - h.started_at, 1) if h.alive and h.started_at else None, metrics.get(h.index, {}))
                 for h in sl.session.hosts]
        cloud, owner = {**seen_.cloud, **sl.node.status()}, True  # the node's own look wins
    else:  # as its owning kernel last recorded it
        owner = owner_running(record)
        metrics = combine(reg.latest_metrics(record.name)) if owner else {}
        hosts = [HostView(h.index, layout.name(h.index), layout.slice_of(h.index) if layout.multislice else None,
                          h.address, state, metrics=metrics.get(h.index, {}))
                 for h, state in zip(record.hosts, seen_.host_states)]
        cloud = dict(seen_.cloud)
    view = SliceView(record, seen_, hosts, current, sl is not None, cloud)
    states = sl.services() if ask_services and sl is not None else recorded_services(
        record, provision.local_transports(record))
    view.services = service_rows(record.name, states, view.usd_per_hour)
    view.forwards = forward_rows(record.name)
    # the watchdog keeps the node while a service runs, and cannot delete it while it fails to
    view.idle_delete_in = idle_delete_in(reg.idle_mark(record.name), owner, now,
                                         held=bool(view.busy_services or cloud.get("idle_delete_failing")))
    return view


def _live_state(alive: bool, needs_restart: bool) -> str:
    """A held host's state: running, gone, or needing the %tpu_restart that could not reach it."""
    return "running" if alive else "needs restart" if needs_restart else "gone"
