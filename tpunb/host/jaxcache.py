"""JAX's persistent compilation cache on this host: its hits counted as JAX reports them, and the
entries that another host's process 0 wrote brought here.

JAX writes cache entries from process 0 only (``jax/_src/compiler.py`` ``_cache_write``), and an
entry carries no process id, so on a slice whose hosts each keep the cache on their own disk,
hosts 1..N never hit it. tpunb copies process 0's new entries to the other hosts (at
``%tpu_restart``, with the fetch's relay): host 0 stages them (``stage``: hard links, each with
its sha256), the fetch puts them into each other host's staging folder, and ``publish`` moves
them into the cache under JAX's own lock (``.lockfile``, which JAX's LRU cache takes with
filelock's ``fcntl.flock``), each entry's ``-atime`` before its ``-cache`` so JAX's eviction
never meets an entry without one.

Shipped to hosts: standard library only (see the package docstring).
"""
from __future__ import annotations

import fcntl
import hashlib
import importlib
import json
import os
import shutil
import threading
import time

#: the events counted: JAX's monitoring names, by their last part
EVENTS = ("/jax/compilation_cache/cache_hits", "/jax/compilation_cache/cache_misses",
          "/jax/compilation_cache/compile_requests_use_cache")
#: an entry's files in JAX's LRU cache (``jax/_src/lru_cache.py``)
CACHE_SUFFIX, ATIME_SUFFIX = "-cache", "-atime"
#: where entries copied from host 0 wait until they are published, below the cache's folder
INCOMING = ".tpunb-incoming"
#: JAX's lock file in the cache's folder
LOCKFILE = ".lockfile"
#: each staged entry's sha256 by (size, mtime), so an entry is hashed once
DIGESTS = os.path.join(".cache", "tpunb", "jax-cache-digests.json")

_counts = {name.rsplit("/", 1)[1]: 0 for name in EVENTS}
_lock = threading.Lock()
_listening = False


def listen(jax_module) -> None:
    """Count JAX's compilation-cache events in this process (once: the listener stays)."""
    global _listening
    with _lock:
        if _listening:
            return
        _listening = True

    def heard(event: str, *args, **kwargs) -> None:
        if event in EVENTS:
            with _lock:
                _counts[event.rsplit("/", 1)[1]] += 1

    try:
        monitoring = importlib.import_module(f"{jax_module.__name__}.monitoring")
    except ImportError:  # a jax without it (a stand-in, an old release): nothing to count
        return
    monitoring.register_event_listener(heard)


def stats() -> dict:
    """In this process so far: compiles that asked the cache (``requests``), those it answered
    (``hits``), the rest (``misses``), and entries this process wrote (``written``: JAX names its
    write event ``cache_misses``, and writes from process 0 only)."""
    with _lock:
        requests, hits = _counts["compile_requests_use_cache"], _counts["cache_hits"]
        return {"hits": hits, "misses": requests - hits, "requests": requests, "written": _counts["cache_misses"],
                "listening": _listening}


def local_dir() -> str | None:
    """This host's cache folder when it is on a disk of its own (not gs://), else None."""
    place = os.environ.get("JAX_COMPILATION_CACHE_DIR") or ""
    if not place or "://" in place and not place.startswith("file://"):
        return None
    return os.path.abspath(os.path.expanduser(place.removeprefix("file://")))


def listing() -> dict:
    """The cache's folder and the keys of the entries in it ({key: size})."""
    root = local_dir()
    if root is None or not os.path.isdir(root):
        return {"root": root, "keys": {}}
    keys = {}
    for name in os.listdir(root):
        if name.endswith(CACHE_SUFFIX):
            try:
                keys[name[:-len(CACHE_SUFFIX)]] = os.path.getsize(os.path.join(root, name))
            except OSError:
                pass
    return {"root": root, "keys": keys}


class _Locked:
    """JAX's cache lock held (the same ``fcntl.flock`` on ``.lockfile`` that filelock takes)."""

    def __init__(self, root: str) -> None:
        self.path = os.path.join(root, LOCKFILE)

    def __enter__(self) -> "_Locked":
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


def _digest(path: str, known: dict) -> str:
    stat = os.stat(path)
    key = f"{os.path.basename(path)}:{stat.st_size}:{stat.st_mtime_ns}"
    if key not in known:
        digest = hashlib.sha256()
        with open(path, "rb") as held:
            for piece in iter(lambda: held.read(1 << 20), b""):
                digest.update(piece)
        known[key] = digest.hexdigest()
    return known[key]


def stage(keys: list[str]) -> dict:
    """Host 0: the entries ``keys`` (each its -cache and -atime files) linked into the staging
    folder, under JAX's lock (no entry half-written); their wire entries for a fetch (path, size,
    sha256). Keys no longer there (evicted) are left out."""
    root = local_dir()
    if root is None:
        return {"status": "error", "error": "the compile cache is not on this host's disk"}
    incoming = os.path.join(root, INCOMING)
    os.makedirs(incoming, exist_ok=True)
    record = os.path.join(root, DIGESTS)
    try:
        with open(record) as kept:
            known = json.load(kept)
    except (OSError, ValueError):
        known = {}
    entries = []
    with _Locked(root):
        for key in keys:
            for suffix in (ATIME_SUFFIX, CACHE_SUFFIX):
                name = key + suffix
                source, staged = os.path.join(root, name), os.path.join(incoming, name)
                try:
                    if not os.path.exists(staged):
                        os.link(source, staged)
                    entries.append({"path": name, "size": os.path.getsize(staged), "url": "", "check": "sha256",
                                    "digest": _digest(staged, known), "headers": {}})
                except OSError:
                    continue
    try:
        os.makedirs(os.path.dirname(record), exist_ok=True)
        with open(record, "w") as out:
            json.dump(known, out)
    except OSError:
        pass
    return {"status": "ok", "root": root, "entries": entries}


def publish(incoming: str) -> int:
    """The staged entries moved into the cache (its folder is the staging folder's parent) under
    JAX's lock, each -atime before its -cache; an entry the cache holds already stays as it is.
    The staging folder goes. The entries published."""
    root = os.path.dirname(incoming)
    if not os.path.isdir(incoming):
        return 0
    names = sorted(n for n in os.listdir(incoming) if n.endswith((ATIME_SUFFIX, CACHE_SUFFIX)))
    published = 0
    with _Locked(root):
        for name in sorted(names, key=lambda n: n.endswith(CACHE_SUFFIX)):  # -atime first
            target = os.path.join(root, name)
            if os.path.exists(target):
                continue
            os.replace(os.path.join(incoming, name), target)
            if name.endswith(CACHE_SUFFIX):
                published += 1
                atime = target[:-len(CACHE_SUFFIX)] + ATIME_SUFFIX
                if not os.path.exists(atime):  # JAX's eviction reads every entry's -atime
                    with open(atime, "wb") as out:
                        out.write(time.time_ns().to_bytes(8, "little"))
    shutil.rmtree(incoming, ignore_errors=True)
    return published
