"""State that survives the slice: %tpu_snapshot and %tpu_restore in the kernel.

``snapshot(sl, names, to)`` saves named host variables from every host: global jax.Arrays (and
pytrees of them) with orbax-checkpoint, each host writing its own shards; anything else per host
with cloudpickle. ``restore(sl, uri, names)`` loads them onto whatever slice ``sl`` is, re-sharding
each array onto a mesh with the same axis names (``plan``); everything is checked before anything
loads. The steps run on the hosts (``tpunb_host.snapshot``) as cells (``remote``); the manifest is
written last, so an interrupted snapshot never looks complete. ``store`` knows where snapshots
live; ``preempt`` arms hosts to snapshot when their VM is reclaimed.
"""
from __future__ import annotations

import dataclasses
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

from tpunb import provision, report
from tpunb.errors import SnapshotError, TpunbError, UsageError
from tpunb.host.snapshot import compose_manifest
from tpunb.snapshot import remote, places as store
from tpunb.snapshot.plan import plan_restore
from tpunb.snapshot.places import Snapshot, snapshots
from tpunb.units import format_bytes

if TYPE_CHECKING:
    from tpunb.slice import Slice

#: a snapshot or restore this big shows a progress bar
PROGRESS_BYTES = 16 * 2**20

__all__ = ["snapshot", "restore", "snapshots", "Snapshot", "Restored"]


@dataclasses.dataclass(frozen=True)
class Restored:
    """What a restore brought back: names, from where, and how each array is laid out now."""

    uri: str
    names: tuple[str, ...]
    source: Snapshot
    shardings: dict


def check_names(names) -> list[str]:
    names = [names] if isinstance(names, str) else list(names or [])
    bad = [n for n in names if not isinstance(n, str) or not n.isidentifier()]
    if not names or bad:
        raise UsageError(f"give variable names to snapshot, e.g. %tpu_snapshot params step{' (not ' + repr(bad[0]) + ')' if bad else ''}")
    return list(dict.fromkeys(names))


def snapshot(sl: "Slice", names, to: str | None = None, bucket: str | None = None, reason: str = "") -> Snapshot:
    """Save ``names`` from every host of ``sl`` to ``to`` (a path every host reaches, or
    gs://BUCKET/PATH; default: a new folder under $TPUNB_HOME, or the bucket for cloud slices)."""
    names = check_names(names)
    if bucket:
        store.bucket(bucket)
    uri = store.new_uri(provision.snapshots_in_cloud(sl.record), sl.name, to, reason)
    began = time.perf_counter()
    remote.call(sl, "begin", {"uri": uri}, hosts=[0])
    progress = _Bytes(f"snapshot {', '.join(names)}")
    try:
        records = _prepare(sl, uri, names, progress)
        manifest = _manifest(sl, names, records, reason)
        values = sum(n["bytes"] for n in manifest["names"].values())
        progress.total = values + sum(a["nbytes"] for a in manifest["arrays"].values())
        progress.show()
        remote.call(sl, "write", {"uri": uri, "orbax": sorted(n for n in names if manifest["names"][n]["arrays"])},
                    per_host={0: {"progress_every": remote.PROGRESS_EVERY}}, progress=progress)
        manifest["seconds"] = time.perf_counter() - began
        committed = remote.call(sl, "commit", {"uri": uri, "manifest": manifest}, hosts=[0])
        progress.show(progress.total)
    except BaseException:
        progress.close()
        _discard(sl, uri)
        raise
    progress.close()
    manifest["size"] = committed[0]["size"]
    store.remember(uri, manifest)
    made = Snapshot.from_manifest(uri, manifest)
    report.info(f"[tpunb] snapshot of {', '.join(names)} ({format_bytes(made.size or 0)}) from {made.shape} in "
                f"{manifest['seconds']:.1f} s: {uri}")
    return made


def _prepare(sl: "Slice", uri: str, names: list[str], progress: _Bytes) -> dict[int, dict]:
    """Every host checks and pickles its values; a name missing or unpicklable anywhere is one line."""
    replies = remote.call(sl, "prepare", {"uri": uri, "names": names, "progress": True}, refusals=True,
                          progress=progress)
    missing: dict[str, list[int]] = {}
    for host, reply in sorted(replies.items()):
        for name in reply.get("missing", []):
            missing.setdefault(name, []).append(host)
    if missing:
        said = "; ".join(f"{n} on host{'s' if len(h) > 1 else ''} {sl.layout.names(h)}" for n, h in missing.items())
        raise SnapshotError(f"not defined: {said}: define {'it' if len(missing) == 1 else 'them'} there (%%on_tpu), "
                            "or snapshot other names")
    for host, reply in sorted(replies.items()):
        if reply.get("unpicklable"):
            raise SnapshotError(f"{reply['unpicklable']} cannot be pickled on host {sl.layout.name(host)} "
                                f"({reply['error']}): snapshot what it is made of instead, or leave it out")
    for host, reply in sorted(replies.items()):
        if not reply.get("ok"):
            raise SnapshotError(f"host {sl.layout.name(host)}: {reply.get('error')}")
    records = {host: reply["record"] for host, reply in replies.items()}
    first = records[min(records)]
    for host, record in records.items():
        for name in names:
            if record["names"][name]["arrays"] != first["names"][name]["arrays"]:
                raise SnapshotError(f"{name} holds different global jax.Arrays on host {sl.layout.name(host)} than on "
                                    f"host {sl.layout.name(min(records))}: run the cell that makes it on every host")
    return records


def _manifest(sl: "Slice", names: list[str], records: dict[int, dict], reason: str) -> dict:
    return compose_manifest(template(sl), names, records, reason or "snapshot")


def template(sl: "Slice") -> dict:
    """What a manifest says of the slice it was taken from."""
    return {"slice": sl.name, "accelerator": sl.kind, "backend": sl.backend}


class _Bytes:
    """Progress of a snapshot or restore as the hosts report it: each host's values as it writes
    them, and the arrays (host 0 measures the shared place). A tqdm bar once it passes 16 MB."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.values: dict[int, int] = {}
        self.arrays = 0
        self.total: int | None = None
        self._bar = None
        self._update = None

    def __call__(self, host: int, report_: dict) -> None:
        if report_.get("what") == "arrays":
            self.arrays = int(report_["bytes"])
        else:
            self.values[host] = int(report_["bytes"])
        self.show()

    @property
    def done(self) -> int:
        return sum(self.values.values()) + self.arrays

    def show(self, done: int | None = None) -> None:
        done = self.done if done is None else done
        if self._bar is None and max(done, self.total or 0) < PROGRESS_BYTES:
            return
        if self._bar is None:
            from tpunb.widgets.copy_progress import byte_progress

            self._bar = byte_progress(self.what)
            self._update = self._bar.__enter__()
        total = max(self.total or 0, done) if self.total is not None else None
        self._update(min(done, total) if total else done, total)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.__exit__(None, None, None)
            self._bar = None


def _discard(sl: "Slice", uri: str) -> None:
    """After a failure or Ctrl-C: remove what was written (it has no manifest, so it never looked
    complete); if that fails too, say where it is."""
    try:
        if not uri.startswith("gs://") and Path(uri).exists() and store.read_manifest(uri) is None:
            shutil.rmtree(uri, ignore_errors=True)
        if uri.startswith("gs://") or Path(uri).exists():
            remote.call(sl, "discard", {"uri": uri}, hosts=[0])
    except (TpunbError, KeyboardInterrupt, OSError):
        report.warn(f"[tpunb] the unfinished snapshot in {uri} was left there (it has no manifest, so it is not "
                    "complete and is never restored)")


def restore(sl: "Slice", uri: str | None = None, names=None) -> Restored:
    """Load a snapshot (default: the newest complete one of this slice, else of any) onto ``sl``."""
    if names is not None:
        names = check_names(names)
    source = _find(sl, uri)
    uri = source.uri
    replies = remote.call(sl, "read", {"uri": uri, "names": names or []}, refusals=True)
    if not all(r.get("ok") for r in replies.values()):
        errors = [f"host {sl.layout.name(h)}: {r['error']}" for h, r in sorted(replies.items()) if r.get("error")]
        if errors:
            raise SnapshotError("; ".join(errors))
        if any(r.get("incomplete") for r in replies.values()):
            raise SnapshotError(f"{uri} is not a complete snapshot: it has no manifest (interrupted, or out of time "
                                "when its VM was reclaimed); restore an earlier one (%tpu_snapshot --list)")
        raise SnapshotError(f"no snapshot at {uri} (as the hosts see it): check the path (%tpu_snapshot --list)")
    manifest = replies[0]["manifest"]
    source = Snapshot.from_manifest(uri, manifest)
    devices = replies[0].get("devices")
    limits = [r["hbm_bytes"] for r in replies.values() if r.get("hbm_bytes")]
    plan = plan_restore(manifest, names, sl.num_hosts, devices, sl.accelerator, min(limits) if limits else None)
    progress = _Bytes(f"restore {', '.join(plan.names)}")
    progress.total = sum(manifest["arrays"][k]["nbytes"] for keys in plan.arrays.values() for k in keys)
    args = {"uri": uri, "names": plan.names}
    remote.call(sl, "fetch", args, per_host={h: {"sources": plan.sources[h]} for h in plan.sources})
    progress.show(0)
    try:
        loaded = remote.call(sl, "load", {**args, "arrays": plan.arrays, "meshes": plan.meshes,
                                          "array_mesh": plan.array_mesh})
        progress.show(progress.total)
    finally:
        progress.close()
    shardings = loaded[0].get("shardings", {})
    made = Restored(uri, tuple(plan.names), source, shardings)
    report.info(_said(sl, made))
    return made


def _find(sl: "Slice", uri: str | None) -> Snapshot:
    if uri:
        found = store.new_uri(provision.snapshots_in_cloud(sl.record), sl.name, uri)
        return Snapshot(found, False)
    newest = store.latest(sl.name) or store.latest()
    if newest is None:
        raise SnapshotError("no complete snapshot yet: take one with %tpu_snapshot NAME, or give the snapshot's "
                            "place: %tpu_restore DIR")
    return newest


def _said(sl: "Slice", made: Restored) -> str:
    taken = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(made.source.time)) if made.source.time else "?"
    arrays = []
    for name, layouts in made.shardings.items():
        shown = sorted(set(layouts.values()))
        arrays.append(f"{name} as {shown[0]}" if len(shown) == 1 else f"{name} ({len(layouts)} arrays)")
    laid = f"; {', '.join(arrays)}" if arrays else ""
    hosts = f"{sl.num_hosts} host{'s' if sl.num_hosts != 1 else ''}"
    return (f"[tpunb] restored {', '.join(made.names)} onto {sl.kind} ({hosts}) from a snapshot of "
            f"{made.source.shape} taken {taken}{laid}")
