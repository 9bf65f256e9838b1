"""The host side of %tpu_snapshot and %tpu_restore: named values of this host's namespace written
to a folder or a Cloud Storage prefix, and read back, possibly onto another slice shape.

Shipped to hosts: standard library only (see the package docstring). jax, orbax-checkpoint,
tensorstore and cloudpickle are imported inside functions, only when a snapshot needs them.

A snapshot at URI (a path every host can reach, or ``gs://BUCKET/PATH``) is:

    arrays/NAME/         orbax-checkpoint of NAME's global jax.Arrays (each host writes its own shards)
    host-I/NAME.pkl      host I's value of NAME (cloudpickle), or its pytree with the arrays left out
    host-I.json          host I's record, written once its part is durable
    manifest.json        written last, by host 0: only a snapshot with a manifest is complete

The kernel drives each step as a cell that calls ``entry`` (``tpunb.snapshot.remote``); a step
answers with one marker line on stdout (``REPLY``), so nothing is shown and nothing is left in the
namespace. ``tpunb_host.preempt`` calls the same steps itself when the VM is being reclaimed.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import threading
import time

from . import gcs

#: marker lines a step prints for the kernel: its answer, and bytes written so far
REPLY = "\x1etpunb-snapshot-reply "
PROGRESS = "\x1etpunb-snapshot-progress "
MANIFEST = "manifest.json"
FORMAT = 1

#: what prepare found, kept for the write that follows (the kernel runs nothing in between)
_pending: dict[str, dict] = {}


class SnapshotError(Exception):
    """A one-line reason a step cannot go on; the kernel shows it as it is."""


class Slot:
    """Where a global jax.Array sat in a pytree; its data is in ``arrays/NAME``."""

    def __init__(self, key: str) -> None:
        self.key = key

    def __repr__(self) -> str:
        return f"Slot({self.key!r})"


# -- storage ---------------------------------------------------------------------------------
class Store:
    """Files under a snapshot's URI: a local path, or gs://BUCKET/PATH over Cloud Storage's JSON
    API (``gcs``; a local server stands in when $STORAGE_EMULATOR_HOST names one)."""

    def __init__(self, uri: str) -> None:
        self.uri = uri.rstrip("/")
        self.remote = uri.startswith("gs://")
        if self.remote:
            bucket, self.prefix = gcs.split(self.uri)
            self.bucket = gcs.Bucket(bucket)
        else:
            self.root = os.path.abspath(os.path.expanduser(self.uri))

    def path(self, rel: str = "") -> str:
        base = self.uri if self.remote else self.root
        return f"{base}/{rel}" if rel else base

    def _key(self, rel: str) -> str:
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def write(self, rel: str, data: bytes) -> None:
        if self.remote:
            self.bucket.write(self._key(rel), data)
            return
        target = os.path.join(self.root, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        temporary = f"{target}.tmp-{os.getpid()}"
        try:
            with open(temporary, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(temporary, target)
        except BaseException:
            try:
                os.unlink(temporary)
            except OSError:
                pass
            raise

    def read(self, rel: str) -> bytes | None:
        if self.remote:
            return self.bucket.read(self._key(rel))
        try:
            with open(os.path.join(self.root, rel), "rb") as f:
                return f.read()
        except (FileNotFoundError, NotADirectoryError):
            return None

    def list(self, prefix: str = "") -> list[tuple[str, int]]:
        """(name relative to the URI, size) of every file under ``prefix``."""
        if self.remote:
            skip = len(self.prefix) + 1 if self.prefix else 0
            return [(name[skip:], size) for name, size in self.bucket.list(self._key(prefix))]
        found = []
        for folder, _, files in os.walk(os.path.join(self.root, prefix)):
            for name in files:
                full = os.path.join(folder, name)
                try:
                    found.append((os.path.relpath(full, self.root), os.path.getsize(full)))
                except OSError:
                    pass
        return found

    def size(self, prefix: str = "") -> int:
        return sum(size for _, size in self.list(prefix))

    def top(self) -> set[str]:
        """The names directly under the URI."""
        if self.remote:
            return {name.split("/", 1)[0] for name, _ in self.list()}
        try:
            return set(os.listdir(self.root))
        except (FileNotFoundError, NotADirectoryError):
            return set()

    def delete(self, rel: str) -> None:
        if self.remote:
            self.bucket.delete(self._key(rel))
        else:
            try:
                os.unlink(os.path.join(self.root, rel))
            except FileNotFoundError:
                pass

    def remove_all(self) -> None:
        if self.remote:
            for name, _ in self.list():
                self.bucket.delete(self._key(name))
        else:
            shutil.rmtree(self.root, ignore_errors=True)


def storage_env() -> None:
    """Before orbax: tensorstore's gcs driver reads its endpoint from its own variable."""
    emulator = os.environ.get("STORAGE_EMULATOR_HOST")
    if emulator and not os.environ.get("TENSORSTORE_GCS_HTTP_URL"):
        os.environ["TENSORSTORE_GCS_HTTP_URL"] = emulator if "://" in emulator else f"http://{emulator}"


# -- what a value is made of ------------------------------------------------------------------
def _jax():
    """jax, if a cell imported it (no value can hold a jax.Array otherwise)."""
    return sys.modules.get("jax")


def _is_global(jax, leaf) -> bool:
    """A jax.Array orbax writes shard by shard: one spread over processes, or any on one process."""
    return isinstance(leaf, jax.Array) and (not leaf.is_fully_addressable or jax.process_count() == 1)


def sharding_record(jax, array) -> dict:
    """How ``array`` is laid out, in terms another slice can apply: a NamedSharding's mesh axes and
    PartitionSpec; a single device; or something else (restored replicated)."""
    sharding = array.sharding
    if isinstance(sharding, jax.sharding.NamedSharding):
        spec = [list(p) if isinstance(p, tuple) else p for p in sharding.spec]
        types = getattr(sharding.mesh, "axis_types", None)
        return {"kind": "named", "axes": list(sharding.mesh.axis_names),
                "sizes": [int(s) for s in sharding.mesh.devices.shape], "spec": spec,
                "axis_types": [getattr(t, "name", str(t)) for t in types] if types else None}
    if isinstance(sharding, jax.sharding.SingleDeviceSharding):
        return {"kind": "single"}
    return {"kind": "other", "repr": repr(sharding)[:200]}


def split_value(name: str, value):
    """(what is pickled, {key: global jax.Array}) for one named value: a global array or a pytree
    holding some is pickled with a Slot where each array was; anything else whole."""
    jax = _jax()
    if jax is None:
        return ("value", value), {}
    leaves, treedef = jax.tree_util.tree_flatten(value)
    arrays = {}
    for i, leaf in enumerate(leaves):
        if _is_global(jax, leaf):
            key = f"{name}__{len(arrays)}"
            arrays[key] = leaf
            leaves[i] = Slot(key)
    if not arrays:
        return ("value", value), {}
    return ("tree", jax.tree_util.tree_unflatten(treedef, leaves)), arrays


def _pickler():
    try:
        import cloudpickle

        return cloudpickle
    except ImportError:
        import pickle

        return pickle


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__


def _space_error(exc: BaseException, what: str) -> SnapshotError | None:
    """Out of disk or quota, said in one line; None for other errors."""
    text = str(exc)
    if getattr(exc, "errno", None) in (28, 122) or "No space left" in text or "quota" in text.lower():
        return SnapshotError(f"no space left writing {what}: free some, or snapshot to a bigger place (--to)")
    return None


# -- saving -----------------------------------------------------------------------------------
def begin(namespace: dict, args: dict) -> dict:
    """Host 0, first: make URI ready. A complete snapshot there is replaced (its manifest goes first,
    so it never looks complete half-written); a folder holding anything else is refused."""
    store = Store(args["uri"])
    replaced = False
    if store.top():
        if store.read(MANIFEST) is not None:
            replaced = True
            store.delete(MANIFEST)  # first: a crash from here on leaves an unfinished snapshot, never a mixed one
        elif not _looks_like_snapshot(store):
            raise SnapshotError(f"{args['uri']} holds other files: snapshot to a new or empty folder")
        store.remove_all()
    if not store.remote:
        os.makedirs(store.root, exist_ok=True)
    return {"replaced": replaced}


def _looks_like_snapshot(store: Store) -> bool:
    """An unfinished snapshot (interrupted, or out of time): only our own names at the top."""
    names = store.top()
    return all(n == "arrays" or n.startswith(("host-", "notice-", MANIFEST)) for n in names)


def prepare(namespace: dict, args: dict) -> dict:
    """Every host: check the names, pickle and write what is not a global array (a name missing or
    that cannot be pickled here stops it; the kernel then removes what was written), and describe
    the arrays."""
    host, names = int(args["host"]), list(args["names"])
    missing = [n for n in names if n not in namespace]
    if missing:
        return {"ok": False, "missing": missing}
    pickler = _pickler()
    store = Store(args["uri"])
    record: dict = {"host": host, "names": {}, "arrays": {}}
    arrays, written = {}, 0
    for name in names:  # each written as soon as it is pickled: a huge value is never held twice
        kept, found = split_value(name, namespace[name])
        try:
            data = pickler.dumps(kept, protocol=5)
        except Exception as exc:  # noqa: BLE001 - whatever the value's __reduce__ raises
            return {"ok": False, "unpicklable": name, "error": one_line(exc)}
        try:
            store.write(f"host-{host}/{name}.pkl", data)
        except Exception as exc:  # noqa: BLE001
            raise _space_error(exc, f"{name} on host {host} ({len(data):,} bytes)") or SnapshotError(
                f"cannot write {name} on host {host}: {one_line(exc)}") from None
        written += len(data)
        if args.get("progress"):
            say(PROGRESS, {"bytes": written, "what": "values"})
        arrays.update(found)
        record["names"][name] = {"kind": kept[0], "bytes": len(data), "digest": hashlib.sha256(data).hexdigest(),
                                 "arrays": sorted(found), "type": type(namespace[name]).__name__}
        del data
    jax = _jax()
    for key, array in arrays.items():
        record["arrays"][key] = {"shape": list(array.shape), "dtype": str(array.dtype), "nbytes": int(array.nbytes),
                                 "sharding": sharding_record(jax, array)}
    if jax is not None and arrays:
        record["devices"] = jax.device_count()
        record["processes"] = jax.process_count()
    _pending[args["uri"]] = {"arrays": arrays, "record": record}
    return {"ok": True, "record": record}


def write(namespace: dict, args: dict) -> dict:
    """Every host, at once: each name's global arrays with orbax (every host writes its own shards;
    orbax's barriers make the call collective), then this host's record."""
    uri, host = args["uri"], int(args["host"])
    pending = _pending.pop(uri, None)
    if pending is None:
        raise SnapshotError(f"host {host} lost what it prepared for {uri}: snapshot again")
    store = Store(uri)
    began = time.perf_counter()
    if args.get("orbax"):
        by_name: dict[str, dict] = {}
        for key, array in pending["arrays"].items():
            by_name.setdefault(key.rsplit("__", 1)[0], {})[key] = array
        with _Progress(store, "arrays", float(args.get("progress_every") or 0)):
            for name in sorted(args["orbax"]):  # the same order on every host: the saves are collective
                try:
                    _save_arrays(store.path(f"arrays/{name}"), by_name.get(name, {}))
                except Exception as exc:  # noqa: BLE001
                    raise _space_error(exc, f"the arrays of {name}") or SnapshotError(
                        f"cannot write the arrays of {name}: {one_line(exc)}") from None
    record = {**pending["record"], "seconds": time.perf_counter() - began}
    try:
        store.write(f"host-{host}.json", json.dumps(record).encode())
    except Exception as exc:  # noqa: BLE001
        raise _space_error(exc, f"host {host}'s record") or SnapshotError(one_line(exc)) from None
    return {"ok": True, "seconds": record["seconds"]}


def _save_arrays(directory: str, arrays: dict) -> None:
    storage_env()
    import orbax.checkpoint as ocp

    checkpointer = ocp.StandardCheckpointer()
    try:
        checkpointer.save(directory, arrays)
        checkpointer.wait_until_finished()
    finally:
        checkpointer.close()


class _Progress:
    """While arrays are written: this host's bytes under ``prefix``, printed as a marker line
    every ``every`` seconds (0: never), for the kernel's progress bar."""

    def __init__(self, store: Store, prefix: str, every: float) -> None:
        self.store, self.prefix, self.every = store, prefix, every
        self.stop = threading.Event()
        self.thread = None

    def __enter__(self):
        if self.every > 0:
            self.thread = threading.Thread(target=self._run, daemon=True, name="tpunb-snapshot-progress")
            self.thread.start()
        return self

    def _run(self) -> None:
        while not self.stop.wait(self.every):
            try:
                say(PROGRESS, {"bytes": self.store.size(self.prefix), "what": "arrays"})
            except Exception:  # noqa: BLE001 - a progress bar never fails the snapshot
                pass

    def __exit__(self, *exc) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join()


def compose_manifest(template: dict, names: list[str], records: dict, reason: str) -> dict:
    """The manifest from every host's record: per name its kind, bytes over all hosts and whether
    every host held the same value; the arrays as host 0 described them."""
    first = records[min(records)]
    described = {}
    for name in names:
        mine = [records[h]["names"][name] for h in sorted(records)]
        described[name] = {"kind": "array" if mine[0]["arrays"] else mine[0]["kind"], "type": mine[0]["type"],
                           "arrays": mine[0]["arrays"], "bytes": sum(m["bytes"] for m in mine),
                           "same_on_all_hosts": len({m["digest"] for m in mine}) == 1}
    return {**template, "format": FORMAT, "time": time.time(), "hosts": len(records), "devices": first.get("devices"),
            "reason": reason, "names": described, "arrays": first["arrays"]}


def commit(namespace: dict, args: dict) -> dict:
    """Host 0, last: once every host's record is there, the manifest makes the snapshot complete."""
    store = Store(args["uri"])
    manifest = args["manifest"]
    missing = [i for i in range(int(manifest["hosts"])) if store.read(f"host-{i}.json") is None]
    if missing:
        raise SnapshotError(f"hosts {missing} did not finish their part: the snapshot is not complete")
    manifest["size"] = store.size()
    store.write(MANIFEST, json.dumps(manifest).encode())
    return {"ok": True, "size": manifest["size"]}


def discard(namespace: dict, args: dict) -> dict:
    """Host 0: remove an unfinished snapshot (a failed or interrupted one); a complete one stays."""
    store = Store(args["uri"])
    if store.read(MANIFEST) is None:
        store.remove_all()
    return {"ok": True}


# -- restoring --------------------------------------------------------------------------------
def read(namespace: dict, args: dict) -> dict:
    """Every host: the manifest (host 0 sends it), and what this host offers: devices, HBM."""
    store = Store(args["uri"])
    data = store.read(MANIFEST)
    if data is None:
        unfinished = bool(store.top())
        return {"ok": False, "incomplete": unfinished}
    manifest = json.loads(data)
    reply = {"ok": True, "manifest": manifest if int(args["host"]) == 0 else None}
    chosen = [n for n in (args.get("names") or manifest.get("names", {})) if n in manifest.get("names", {})]
    if any(manifest["names"][n].get("arrays") for n in chosen):  # only then does this slice need JAX
        import jax  # starts jax.distributed on every host (the agent's import hook)

        reply.update(devices=jax.device_count(), local_devices=jax.local_device_count(),
                     process=jax.process_index(), hbm_bytes=_hbm_limit(jax))
    return reply


def _hbm_limit(jax) -> int | None:
    try:
        stats = jax.local_devices()[0].memory_stats() or {}
    except Exception:  # noqa: BLE001 - CPU devices have none
        return None
    return stats.get("bytes_limit")


_staged: dict[str, dict] = {}


def fetch(namespace: dict, args: dict) -> dict:
    """Every host: read and unpickle its values of the chosen names (no collective call yet, so a
    host that cannot stops the restore before any array moves); they wait for ``load``."""
    store, pickler = Store(args["uri"]), _pickler()
    _staged.pop(args["uri"], None)
    values = {}
    for name in args["names"]:
        source = args["sources"][name]
        data = store.read(f"host-{source}/{name}.pkl")
        if data is None:
            raise SnapshotError(f"{name}: host-{source}/{name}.pkl is missing from {args['uri']}")
        try:
            values[name] = pickler.loads(data)
        except Exception as exc:  # noqa: BLE001 - a class or module this host lacks, most often
            raise SnapshotError(f"{name} cannot be unpickled on host {args['host']}: {one_line(exc)}") from None
    _staged[args["uri"]] = values
    return {"ok": True}


def load(namespace: dict, args: dict) -> dict:
    """Every host, at once: the arrays of the staged names, re-sharded onto this slice's meshes by
    orbax (collective), put back into their pytrees; then every name is set together."""
    store = Store(args["uri"])
    staged = _staged.pop(args["uri"], None)
    if staged is None:
        raise SnapshotError(f"host {args['host']} lost what it read of {args['uri']}: restore again")
    manifest = json.loads(store.read(MANIFEST) or b"{}")
    meshes: dict = {}
    made, shown = {}, {}
    for name in args["names"]:
        kind, value = staged[name]
        keys = args["arrays"].get(name) or []
        if kind == "tree" and keys:
            targets = {}
            for key in keys:
                mesh_id = args["array_mesh"][key]
                if mesh_id not in meshes:
                    meshes[mesh_id] = _mesh(args["meshes"][mesh_id])
                targets[key] = (manifest["arrays"][key], meshes[mesh_id])
            arrays = _load_arrays(store.path(f"arrays/{name}"), targets)
            value = _fill(value, arrays)
            shown[name] = {key: _describe(a) for key, a in arrays.items()}
        made[name] = value
    namespace.update(made)
    return {"ok": True, "names": sorted(made), "shardings": shown}


def _describe(array) -> str:
    spec = getattr(array.sharding, "spec", None)
    return f"{spec} over {len(array.sharding.device_set)} devices" if spec is not None else repr(array.sharding)


def _mesh(spec: dict):
    """The mesh on this slice's devices; its axes of the kinds they were saved with (Explicit, Auto)."""
    import jax

    kinds = getattr(jax.sharding, "AxisType", None)
    names = spec.get("axis_types")
    if kinds is not None and names and all(n in kinds.__members__ for n in names):
        return jax.make_mesh(tuple(spec["sizes"]), tuple(spec["axes"]), devices=jax.devices(),
                             axis_types=tuple(kinds[n] for n in names))
    return jax.make_mesh(tuple(spec["sizes"]), tuple(spec["axes"]), devices=jax.devices())


def target_sharding(jax, mesh, saved: dict):
    """Where an array goes on this slice: its PartitionSpec on this mesh (same axis names), else
    replicated (or this host's first device, for a value that lived on one device of one host)."""
    from jax.sharding import NamedSharding, PartitionSpec, SingleDeviceSharding

    sharding = saved["sharding"]
    if sharding["kind"] == "named":
        spec = [tuple(p) if isinstance(p, list) else p for p in sharding["spec"]]
        return NamedSharding(mesh, PartitionSpec(*spec))
    if sharding["kind"] == "single" and jax.process_count() == 1:
        return SingleDeviceSharding(jax.devices()[0])
    return NamedSharding(mesh, PartitionSpec())


def _load_arrays(directory: str, targets: dict) -> dict:
    """{key: (saved meta, mesh)} -> {key: jax.Array} laid out on this slice, read by orbax."""
    storage_env()
    import jax
    import numpy as np
    import orbax.checkpoint as ocp

    abstract = {key: jax.ShapeDtypeStruct(tuple(meta["shape"]), np.dtype(meta["dtype"]),
                                          sharding=target_sharding(jax, mesh, meta))
                for key, (meta, mesh) in targets.items()}
    checkpointer = ocp.StandardCheckpointer()
    try:
        return checkpointer.restore(directory, abstract)
    finally:
        checkpointer.close()


def _fill(skeleton, arrays: dict):
    import jax

    return jax.tree_util.tree_map(lambda leaf: arrays[leaf.key] if isinstance(leaf, Slot) else leaf, skeleton)


# -- the kernel's way in ------------------------------------------------------------------------
OPS = {"begin": begin, "prepare": prepare, "write": write, "commit": commit, "discard": discard,
       "read": read, "fetch": fetch, "load": load}


def say(marker: str, payload: dict) -> None:
    sys.stdout.write(marker + json.dumps(payload) + "\n")
    sys.stdout.flush()


def entry(namespace: dict, op: str, args_json: str) -> None:
    """Run one step and print its answer as a marker line; errors are answers too (one line)."""
    try:
        args = json.loads(args_json)
        if args.get("only", args["host"]) != args["host"]:  # another host's step: nothing to do here
            reply = {"ok": True}
        else:
            reply = OPS[op](namespace, args)
    except SnapshotError as exc:
        reply = {"ok": False, "error": str(exc)}
    except Exception as exc:  # noqa: BLE001 - the kernel shows it in one line, naming the host
        reply = {"ok": False, "error": one_line(exc)}
    say(REPLY, reply)
