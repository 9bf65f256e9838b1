"""Where snapshots live and what the kernel knows of them: default places, the bucket named once,
the index of snapshots made from this machine, and their manifests (a local folder, or Cloud
Storage through ``tpunb.host.gcs``).
"""
from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any

from tpunb.errors import UsageError
from tpunb.host import gcs
from tpunb.host.snapshot import MANIFEST
from tpunb.fetch.storage import storage_token
from tpunb.registry import tpunb_home

#: the folder under a bucket that holds snapshots made without --to
BUCKET_FOLDER = "tpunb-snapshots"


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """One snapshot as %tpu_snapshot --list shows it."""

    uri: str
    complete: bool
    time: float | None = None
    size: int | None = None
    names: tuple[str, ...] = ()
    slice: str | None = None
    accelerator: str | None = None
    hosts: int | None = None
    devices: int | None = None
    reason: str = ""
    manifest: dict | None = dataclasses.field(default=None, repr=False, compare=False)

    @classmethod
    def from_manifest(cls, uri: str, manifest: dict) -> "Snapshot":
        return cls(uri, True, manifest.get("time"), manifest.get("size"), tuple(sorted(manifest.get("names", {}))),
                   manifest.get("slice"), manifest.get("accelerator"), manifest.get("hosts"),
                   manifest.get("devices"), manifest.get("reason", ""), manifest)

    @property
    def shape(self) -> str:
        """The slice it came from: 'v4-16 (2 hosts, 8 devices)'."""
        hosts = f"{self.hosts} host{'s' if self.hosts != 1 else ''}" if self.hosts else ""
        devices = f", {self.devices} devices" if self.devices else ""
        return f"{self.accelerator or 'hosts'} ({hosts}{devices})" if hosts else (self.accelerator or "?")


def home() -> Path:
    return tpunb_home() / "snapshots"


# -- the bucket, named once -------------------------------------------------------------------
def bucket(name: str | None = None) -> str | None:
    """The bucket for cloud snapshots: ``name`` (remembered from now on), else the one remembered,
    else $TPUNB_BUCKET; None when no bucket was named."""
    remembered = home() / "bucket"
    if name:
        name = name[len("gs://"):] if name.startswith("gs://") else name
        name = name.strip("/")
        if not name or "/" in name:
            raise UsageError(f"--bucket takes a bucket name, e.g. --bucket my-bucket, not {name!r}")
        remembered.parent.mkdir(parents=True, exist_ok=True)
        remembered.write_text(name)
        return name
    if remembered.exists():
        return remembered.read_text().strip() or None
    return os.environ.get("TPUNB_BUCKET") or None


def default_root(cloud: bool) -> str:
    """Where snapshots without --to go: a folder under $TPUNB_HOME, or the bucket for cloud slices
    (``cloud``: the slice's backend says its snapshots go to Cloud Storage)."""
    if not cloud:
        return str(home())
    name = bucket()
    if not name:
        raise UsageError("a cloud slice snapshots to Cloud Storage: give --to gs://BUCKET/PATH, or name a bucket "
                         "once with --bucket BUCKET (or set TPUNB_BUCKET)")
    return f"gs://{name}/{BUCKET_FOLDER}"


def new_uri(cloud: bool, slice_name: str, to: str | None, reason: str = "") -> str:
    """The snapshot's URI: ``to`` (a path made absolute, or gs://...), else a new folder under the
    default root named by slice and time."""
    if to:
        to = str(to).strip()
        if to.startswith("gs://"):
            bucket_name, path = gcs.split(to)
            if not bucket_name or not path:
                raise UsageError(f"--to {to}: give gs://BUCKET/PATH (a folder in the bucket)")
            return f"gs://{bucket_name}/{path}"
        if "://" in to:
            raise UsageError(f"--to {to}: give a local path or gs://BUCKET/PATH")
        return str(Path(to).expanduser().resolve())
    stamp = time.strftime("%Y%m%d-%H%M%S") + f"-{int(time.time() * 1000) % 1000:03d}"
    return f"{default_root(cloud)}/{slice_name}/{reason + '-' if reason else ''}{stamp}"


# -- reading snapshots ----------------------------------------------------------------------------
def _bucket(name: str) -> gcs.Bucket:
    return gcs.Bucket(name, token=None if gcs.endpoint() != gcs.API else storage_token)


def read_manifest(uri: str) -> dict | None:
    """The manifest, or None (not complete, or not reachable from this machine)."""
    if uri.startswith("gs://"):
        name, path = gcs.split(uri)
        data = _bucket(name).read(f"{path}/{MANIFEST}")
    else:
        try:
            data = (Path(uri) / MANIFEST).read_bytes()
        except OSError:
            return None
    return json.loads(data) if data else None


def visible(uri: str) -> bool:
    """Can this kernel look at ``uri`` itself (Cloud Storage, or a folder on this machine)?"""
    return uri.startswith("gs://") or Path(uri).exists()


def read_table(name: str) -> dict[str, dict]:
    """A small JSON table of ours under $TPUNB_HOME/snapshots ({} when there is none yet)."""
    try:
        return json.loads((home() / name).read_text())
    except (OSError, ValueError):
        return {}


def write_entry(name: str, key: str, value: dict) -> None:
    """Set one entry of such a table (written whole, then renamed: never half a file)."""
    table = read_table(name)
    table[key] = value
    path = home() / name
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(f".tmp-{os.getpid()}")
    temporary.write_text(json.dumps(table))
    temporary.replace(path)


def _index() -> dict[str, dict]:
    return read_table("index.json")


def remember(uri: str, manifest: dict) -> None:
    """Note a snapshot made from this machine (its manifest, for --list when the kernel cannot
    read the place itself: a folder on SSH hosts)."""
    write_entry("index.json", uri, manifest)


def _scan_local(root: Path) -> dict[str, Snapshot]:
    found = {}
    for manifest in root.glob(f"*/*/{MANIFEST}"):
        try:
            found[str(manifest.parent)] = Snapshot.from_manifest(str(manifest.parent), json.loads(manifest.read_text()))
        except (OSError, ValueError):
            continue
    for folder in root.glob("*/*"):  # unfinished: folders of ours without a manifest
        if folder.is_dir() and str(folder) not in found:
            found[str(folder)] = Snapshot(str(folder), False, folder.stat().st_mtime)
    return found


def _scan_bucket(name: str) -> dict[str, Snapshot]:
    store = _bucket(name)
    folders: dict[str, int] = {}
    manifests = []
    for object_name, size in store.list(BUCKET_FOLDER + "/"):
        parts = object_name.split("/")
        if len(parts) < 4:
            continue
        uri = f"gs://{name}/{'/'.join(parts[:3])}"
        folders[uri] = folders.get(uri, 0) + size
        if parts[3] == MANIFEST and len(parts) == 4:
            manifests.append(uri)
    found = {uri: Snapshot(uri, False, size=size) for uri, size in folders.items()}
    for uri in manifests:
        manifest = read_manifest(uri)
        if manifest:
            found[uri] = Snapshot.from_manifest(uri, {**manifest, "size": folders[uri]})
    return found


def snapshots(slice_name: str | None = None, gcs_too: bool = True) -> list[Snapshot]:
    """Every snapshot this machine knows: the default places (this machine's folder, the bucket)
    and those written with --to; oldest first. ``slice_name``: only those taken from that slice."""
    found: dict[str, Snapshot] = {}
    for uri, manifest in _index().items():
        if uri.startswith("gs://") and not gcs_too:
            continue
        if visible(uri):
            current = read_manifest(uri)
            found[uri] = Snapshot.from_manifest(uri, current) if current else Snapshot(uri, False, manifest.get("time"))
        else:
            found[uri] = Snapshot.from_manifest(uri, manifest)
    found.update(_scan_local(home()))
    name = bucket()
    if name and gcs_too:
        found.update(_scan_bucket(name))
    listed = [s for s in found.values() if slice_name is None or s.slice == slice_name or
              (not s.complete and f"/{slice_name}/" in s.uri)]
    return sorted(listed, key=lambda s: (s.time or 0, s.uri))


def latest(slice_name: str | None = None) -> Snapshot | None:
    """The newest complete snapshot (of ``slice_name``, when given)."""
    complete = [s for s in snapshots(slice_name) if s.complete]
    return complete[-1] if complete else None


def table(rows: list[Snapshot]) -> Any:
    """%tpu_snapshot --list as a DataFrame: time, size, names, source slice shape, where."""
    from tpunb.units import format_bytes

    records = [{"time": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(s.time)) if s.time else "",
                "size": format_bytes(s.size) if s.size is not None else "",
                "names": ", ".join(s.names), "from": s.shape if s.complete else "",
                "state": "complete" if s.complete else "incomplete", "reason": s.reason, "uri": s.uri}
               for s in rows]
    return _ListFrame(records, columns=["time", "size", "names", "from", "state", "reason", "uri"])


def _list_frame():
    import pandas as pd

    class ListFrame(pd.DataFrame):
        """Shown whole as text (a terminal, a test), as a table in a notebook."""

        @property
        def _constructor(self):
            return pd.DataFrame

        def __repr__(self) -> str:
            return self.to_string(index=False) if len(self) else "no snapshots yet: take one with %tpu_snapshot NAME"

    return ListFrame


def _ListFrame(records, columns):
    return _list_frame()(records, columns=columns)
