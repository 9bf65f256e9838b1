"""A thread per slice that turns new samples into readers' updates: the registry's latest values
(for the JupyterLab sidebar and other kernels) and every subscribed view, at most once a period."""
from __future__ import annotations

import threading
from typing import Callable

from tpunb.metrics.rings import MetricsStore
from tpunb.registry import Registry

PUBLISH_EVERY = 2.0  # seconds between registry writes: the sidebar polls no faster


class MetricsFeed:
    """``subscribe(callback)``: called with the store after each batch of new samples (on the
    feed's thread, so a widget updates while the kernel runs a cell)."""

    def __init__(self, store: MetricsStore, registry: Registry, slice_name: str, period: float = 0.25,
                 on_gone: Callable[[], None] | None = None) -> None:
        self.store, self.registry, self.slice_name, self.period = store, registry, slice_name, period
        #: called once if the slice's record vanishes from the registry (deleted from the sidebar
        #: or by another kernel's %tpu_down) after it was seen there
        self.on_gone = on_gone
        self._seen_recorded = False
        self._subscribers: list[Callable[[MetricsStore], None]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._published = 0.0

    def subscribe(self, callback: Callable[[MetricsStore], None]) -> Callable[[], None]:
        """Returns the function that unsubscribes."""
        self._subscribers.append(callback)
        return lambda: self._subscribers.remove(callback) if callback in self._subscribers else None

    def start(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, daemon=True, name=f"tpunb-metrics-{self.slice_name}")
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        seen, clock, checked = -1, 0.0, 0.0
        while not self._stop.wait(self.period):
            clock += self.period
            if clock - checked >= PUBLISH_EVERY:
                checked = clock
                if not self._still_recorded():
                    return
            if self.store.version == seen:
                continue
            seen = self.store.version
            for callback in list(self._subscribers):
                try:
                    callback(self.store)
                except Exception:  # a closed widget must not stop the others
                    continue
            if clock - self._published >= PUBLISH_EVERY and self._seen_recorded:
                self._published = clock
                try:
                    self.registry.save_latest_metrics(self.slice_name, self.store.latest_rows())
                except Exception:  # a locked or vanished registry: the next round tries again
                    pass

    def _still_recorded(self) -> bool:
        """False (and ``on_gone`` called) once a record seen before is gone."""
        try:
            recorded = self.registry.get_slice(self.slice_name) is not None
        except Exception:  # a locked registry says nothing either way
            return True
        if recorded:
            self._seen_recorded = True
            return True
        if self._seen_recorded and not self._stop.is_set():
            self._stop.set()
            if self.on_gone is not None:
                self.on_gone()
            return False
        return True
