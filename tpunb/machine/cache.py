"""What the kernel keeps of outside systems for its life: Google Cloud clients, sessions,
credentials, and answers that do not change within a session. Every backend and Cloud Storage
(snapshots) share it, so this cache names no backend."""
from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Any

_cache: dict[Hashable, Any] = {}
_cache_lock = threading.Lock()


def cached(key: Hashable, make: Callable[[], Any]) -> Any:
    """``make()`` for ``key``, made once per kernel (a failure is not kept: the next call tries again).
    Two threads may both make it at first; the first one kept wins."""
    with _cache_lock:
        if key in _cache:
            return _cache[key]
    made = make()
    with _cache_lock:
        return _cache.setdefault(key, made)
