"""Samples from every host of a slice, bounded in memory: one ring per host.

Frames arrive on the hosts' reader threads; ``add`` appends and keeps the latest value of each
(host, metric, chip). ``frame`` is the long-format DataFrame users get from ``Slice.metrics()``.
"""
from __future__ import annotations

import collections
import itertools
import os
import threading
import time
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas

COLUMNS = ["time", "host", "metric", "value", "chip", "step"]
#: samples kept per slice in all (about 100 bytes each), shared out between its hosts
TOTAL_CAP = int(os.environ.get("TPUNB_METRICS_CAP", "400000"))
MIN_PER_HOST = 2000


class MetricsStore:
    """Rings of (time, metric, value, chip, step) per host, and the latest value of each series."""

    def __init__(self, num_hosts: int, cap_per_host: int | None = None) -> None:
        self.cap = cap_per_host or max(MIN_PER_HOST, TOTAL_CAP // max(1, num_hosts))
        self.rings = [collections.deque(maxlen=self.cap) for _ in range(num_hosts)]
        self.latest: dict[tuple[int, str, int | None], tuple[float, float, int | None]] = {}
        self.dropped = [0] * num_hosts  # user samples a host dropped before sending (logged too fast)
        self.version = 0  # bumped on every add: readers redraw only when it moved
        self.received_at = 0.0  # kernel clock of the last add (latency checks)
        self.heard = [None] * num_hosts  # kernel clock of each host's last frame (host clocks may differ)
        self._lock = threading.Lock()

    def add(self, host: int, message: dict) -> None:
        samples = message.get("samples") or []
        with self._lock:
            ring = self.rings[host]
            for t, metric, value, chip, step in samples:
                ring.append((t, metric, value, chip, step))
                self.latest[(host, metric, chip)] = (value, t, step)
            self.dropped[host] += int(message.get("dropped") or 0)
            self.version += 1
            self.received_at = self.heard[host] = time.time()

    def newest(self, host: int, limit: int) -> list[tuple]:
        """One host's latest ``limit`` samples, (time, metric, value, chip, step), newest first:
        what a redraw reads, never the whole ring."""
        with self._lock:
            return list(itertools.islice(reversed(self.rings[host]), limit))

    def last_seen(self, host: int) -> float | None:
        """When (kernel clock) the last frame from ``host`` arrived, or None."""
        return self.heard[host]

    def latest_items(self) -> list[tuple[tuple[int, str, int | None], tuple[float, float, int | None]]]:
        with self._lock:
            return list(self.latest.items())

    def series(self, host: int, metric: str, chip: int | None = None, limit: int | None = None) -> list[tuple]:
        """(time, value, step) of one series, oldest first; the last ``limit`` only."""
        with self._lock:
            points = [(t, v, s) for t, m, v, c, s in self.rings[host] if m == metric and c == chip]
        return points[-limit:] if limit else points

    def metric_names(self) -> list[str]:
        with self._lock:
            return sorted({metric for _, metric, _ in self.latest})

    def latest_rows(self) -> list[tuple[int, str, int | None, float, float]]:
        """(host, metric, chip, value, time) for every series: what the registry publishes."""
        with self._lock:
            return [(h, m, c, v, t) for (h, m, c), (v, t, _) in sorted(self.latest.items(), key=_order)]

    def latest_value(self, host: int, metric: str, reduce=None) -> float | None:
        """The latest value of ``metric`` on ``host``; per-chip values combined with ``reduce`` (sum)."""
        with self._lock:
            values = [v for (h, m, _), (v, _, _) in self.latest.items() if h == host and m == metric]
        if not values:
            return None
        return (reduce or sum)(values)

    def frame(self, since: Any = None) -> "pandas.DataFrame":
        """Long format, one row per sample: time (UTC), host, metric, value, chip, step.

        ``since`` keeps later samples only: a datetime, seconds since the epoch, or a negative
        number of seconds back from now (``since=-60``: the last minute)."""
        import pandas as pd

        cutoff = _cutoff(since)
        with self._lock:
            rows = [(t, host, m, v, c, s) for host, ring in enumerate(self.rings) for t, m, v, c, s in ring
                    if cutoff is None or t >= cutoff]
        table = pd.DataFrame(rows, columns=COLUMNS)
        table["time"] = pd.to_datetime(table["time"], unit="s", utc=True)
        table["chip"] = table["chip"].astype("Int64")
        table["step"] = table["step"].astype("Int64")
        return table.sort_values(["time", "host"], kind="stable").reset_index(drop=True)


def _order(item):
    (host, metric, chip), _ = item
    return host, metric, -1 if chip is None else chip


def _cutoff(since: Any) -> float | None:
    if since is None:
        return None
    if isinstance(since, datetime):
        return since.timestamp()
    if hasattr(since, "timestamp"):  # pandas.Timestamp
        return since.timestamp()
    value = float(since)
    return time.time() + value if value < 0 else value
