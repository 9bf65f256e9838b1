"""Status records as dataclasses: rows per host of every slice (and per orphaned cloud node),
services, forwards and snapshots, a backend's word on a recorded slice; and the DataFrame
%tpu_status shows.

Nothing here fetches anything: ``tpunb.overview`` builds the one status model per slice from the
slices, the registry and the backends, and renders it as these rows or as the sidebar's JSON.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:
    import pandas

#: the cloud columns: dropped from the DataFrame when no row is on Cloud TPU (empty noise). ``api``: which
#: Google API made it (``tpu``: the Cloud TPU API; ``compute``: Compute Engine, whose VMs have a ``machine_type``)
CLOUD_COLUMNS = ("api", "machine_type", "cloud_state", "health", "usd_per_hour")


@dataclass
class HostRow:
    slice: str
    accelerator: str
    backend: str
    host: int | None
    address: str | None
    state: str
    current: bool = False
    slice_index: int | None = None  # which slice of a multislice the host is in (None: a single slice)
    api: str | None = None
    machine_type: str | None = None
    cloud_state: str | None = None
    health: str | None = None
    usd_per_hour: float | None = None
    pid: int | None = None
    runner: str | None = None
    uptime_s: float | None = None
    cpu_percent: float | None = None
    rss_bytes: float | None = None
    memory_used_bytes: float | None = None
    hbm_used_bytes: float | None = None  # all chips of the host
    idle_delete_in: float | None = None  # seconds until the slice's idle watchdog deletes its node
    idle_delete_failing: str | None = None  # "idle delete failing: 403 ...": the watchdog cannot delete it


@dataclass
class SliceStatus:
    """A recorded slice as its backend sees it, so that %tpu_status, the widgets and the sidebar
    say the same thing in the same words and no caller branches on a backend's name."""

    state: str  # the slice's state, one wording per state (see each backend's slice_status)
    host_states: list[str]  # per host: running, gone, connected, not connected
    usd_per_hour: float | None = None  # what it costs now: 0.0 simulated, None unknown
    list_usd_per_hour: float | None = None  # what it would cost on Cloud TPU
    running_s: float | None = None  # how long it has been billed (or alive)
    cloud: dict = field(default_factory=dict)  # HostRow's cloud columns (cloud_state, health, ...)
    cpu_metric: str = "cpu_percent"  # which published metric is the host's CPU bar
    memory_metric: str = "memory_used_bytes"  # and its memory bar


@dataclass
class OrphanStatus:
    """A tpunb cloud node this registry does not hold as a slice: still billed until deleted."""

    name: str
    accelerator: str  # its kind: 'v4-8', or '2 x v4-16'
    num_slices: int
    project: str
    zone: str
    state: str  # the node's cloud state
    spot: bool
    usd_per_hour: float | None
    uptime_s: float | None
    message: str  # why it is an orphan and how to delete it, one line
    cloud: dict = field(default_factory=dict)  # HostRow's cloud columns
    backend: str = ""  # the backend whose survey found it

    def host_row(self) -> HostRow:
        return HostRow(slice=self.name, accelerator=self.accelerator, backend=self.backend, host=None,
                       address=f"{self.project}/{self.zone}", **self.cloud, state=f"ORPHAN: {self.message}")


@dataclass
class ServiceRow:
    """One service on one host: %tpu_status's services table and the sidebar's card list these."""

    slice: str
    service: str
    host: int
    state: str  # one wording (tpunb.services.seen.describe): ready, exited with code 3, restarting (restart 2), ...
    restarts: int
    exit_code: int | None
    pid: int | None
    command: str
    busy: bool  # it runs: it keeps the slice busy (no idle delete) and billing
    usd_per_hour: float | None = None  # what the slice it keeps busy costs
    port: int | None = None  # where it answers (--port, --wait-port or --wait-http)


@dataclass
class ForwardRow:
    """A port forward a live kernel holds: ``url`` on the kernel's machine reaches ``port`` on ``host``."""

    slice: str
    host: int
    port: int
    url: str
    local_port: int
    proxy: str | None = None  # the path under the Jupyter server's base URL (jupyter-server-proxy), or None


@dataclass
class SnapshotRow:
    """One snapshot this machine knows (it outlives its slice): %tpu_status's snapshots table and
    the sidebar's snapshot list show these."""

    slice: str | None  # the slice it was taken from
    names: str  # the variables it holds: 'params, step'
    shape: str  # the slice it came from: 'v4-16 (2 hosts, 8 devices)'
    size_bytes: int | None
    age_s: float | None
    where: str  # 'local' (a folder) or 'gs' (Cloud Storage: it costs money while it exists)
    complete: bool
    uri: str  # the folder, or gs://BUCKET/PATH


#: latest metrics: dropped from the DataFrame when no host has reported any
METRIC_COLUMNS = ("cpu_percent", "rss_bytes", "memory_used_bytes", "hbm_used_bytes")
COLUMNS = ["slice", "current", "accelerator", "backend", *CLOUD_COLUMNS, "idle_delete_in", "idle_delete_failing",
           "slice_index", "host", "address", "state", "pid", "runner", "uptime_s", *METRIC_COLUMNS]


#: columns %tpu_status shows in human units (the returned DataFrame keeps the numbers)
BYTE_COLUMNS = ("rss_bytes", "memory_used_bytes", "hbm_used_bytes", "size_bytes")
SECOND_COLUMNS = ("uptime_s", "idle_delete_in", "age_s")


def readable(table: "pandas.DataFrame") -> "pandas.DataFrame":
    """A copy for people: bytes in KiB/MiB/GiB, seconds as 1h30m, CPU as a percentage, blanks for none."""
    from tpunb.units import format_bytes, format_duration

    shown = table.copy()
    formats = {**{c: format_bytes for c in BYTE_COLUMNS}, **{c: format_duration for c in SECOND_COLUMNS},
               "cpu_percent": lambda v: f"{v:.0f}%", "usd_per_hour": lambda v: f"${v:,.2f}/h"}
    clouds = list(shown["cloud_state"]) if "cloud_state" in shown.columns else [None] * len(shown)
    for column, fmt in formats.items():
        if column in shown.columns:
            shown[column] = [fmt(v) if v is not None and v == v else "" for v in shown[column]]
    if "usd_per_hour" in shown.columns:  # a cloud slice whose price Google does not publish (TPU7x): never $0
        unknown = [isinstance(cloud, str) and bool(cloud) for cloud in clouds]
        shown["usd_per_hour"] = [text or ("price unknown" if cloud else "") for text, cloud in
                                 zip(shown["usd_per_hour"], unknown)]
    if "idle_delete_failing" in shown.columns:  # the watchdog cannot delete: that, not a countdown
        failing = [text if isinstance(text, str) and text else None for text in shown.pop("idle_delete_failing")]
        if "idle_delete_in" in shown.columns:
            shown["idle_delete_in"] = [text or shown_in for text, shown_in in zip(failing, shown["idle_delete_in"])]
    return shown


@functools.cache
def _status_frame_class():
    import pandas as pd

    class StatusFrame(pd.DataFrame):
        """%tpu_status's DataFrame: raw numbers to compute with, human units when displayed."""

        @property
        def _constructor(self):
            return pd.DataFrame  # what is derived from it (a column, a filter) is a plain DataFrame

        def _repr_html_(self) -> str | None:
            extra = "".join(f"<h4>{title}</h4>{table._repr_html_()}" for title, table in self._extra())
            return readable(pd.DataFrame(self))._repr_html_() + extra

        def __repr__(self) -> str:
            return "\n\n".join([repr(readable(pd.DataFrame(self))),
                                 *(f"{title}\n{table.to_string(index=False)}" for title, table in self._extra())])

        def _extra(self) -> list:
            """The services, forwards and snapshots tables (``.attrs``), when there are any."""
            return [(title, readable(self.attrs[key])) for key, title in (
                ("services", "services"), ("forwards", "forwards"), ("snapshots", "snapshots"))
                if key in self.attrs and len(self.attrs[key])]

    return StatusFrame


def frame(rows: Iterable[HostRow], services: Iterable[ServiceRow] = (), forwards: Iterable[ForwardRow] = (),
          snapshots: Iterable[SnapshotRow] = ()) -> "pandas.DataFrame":
    """The rows as %tpu_status shows them: the current slice starred, cloud columns only if needed;
    the services, forwards and snapshots, when any, as tables of their own in ``.attrs`` (shown below it)."""
    import pandas as pd

    records = []
    for row in rows:
        record = dataclasses.asdict(row)
        record["current"] = "*" if row.current else ""
        records.append(record)
    table = pd.DataFrame(records, columns=COLUMNS)
    if table["cloud_state"].isna().all():  # no row is a cloud node
        table = table.drop(columns=list(CLOUD_COLUMNS))
    table["slice_index"] = table["slice_index"].astype("Int64")  # 0, 1 (not 0.0) beside single slices' blanks
    failing = table["idle_delete_failing"].notna()
    empty = [c for c in (*METRIC_COLUMNS, "idle_delete_in", "idle_delete_failing", "slice_index", "machine_type")
             if c in table.columns and table[c].isna().all()]
    if failing.any() and "idle_delete_in" in empty:
        empty.remove("idle_delete_in")  # readable() shows the failure in this column
    shown = _status_frame_class()(table.drop(columns=empty))
    for key, made, cls in (("services", list(services), ServiceRow), ("forwards", list(forwards), ForwardRow),
                           ("snapshots", list(snapshots), SnapshotRow)):
        if made:
            extra = pd.DataFrame([dataclasses.asdict(r) for r in made], columns=[f.name for f in dataclasses.fields(cls)])
            shown.attrs[key] = extra.dropna(axis="columns", how="all")
    return shown


def versions_frame(rows: Iterable) -> "pandas.DataFrame":
    """%tpu_status --versions: one row per host (``tpunb.diagnose.VersionRow``), blanks for none."""
    import pandas as pd

    from tpunb.diagnose import PACKAGES

    table = pd.DataFrame([dataclasses.asdict(r) for r in rows], columns=["slice", "host", "address", *PACKAGES, "env"])
    return table.fillna("")
