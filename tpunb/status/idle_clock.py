"""A slice's side of the idle watchdog on host 0 (cloud slices with ``--idle-delete``): a request
that starts or ends is activity. The kernel mirrors it in the registry (the status view counts down from
it for %tpu_status and the sidebar), and tells host 0's agent, which touches the watchdog's activity file
(tpunb/host/standalone/idle.py). Made from narrow inputs: the registry, the slice's name, the
idle limit and a way to reach host 0."""
from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, Iterator

from tpunb.errors import TransportError

if TYPE_CHECKING:
    from tpunb.registry import Registry


class IdleClock:
    """Marks a slice's activity for its idle watchdog; a no-op without idle autodelete."""

    def __init__(self, registry: "Registry", name: str, seconds: float | None, host0: Callable[[], Any]) -> None:
        self._registry, self._name, self._seconds, self._host0 = registry, name, seconds, host0

    def mark(self, busy: bool, tell_host: bool = False) -> None:
        """A request starts (``busy``) or ends; ``tell_host``: host 0's agent marks it too."""
        if not self._seconds:
            return
        try:
            self._registry.mark_idle(self._name, self._seconds, busy)
        except OSError:
            pass  # the timer in %tpu_status lags; the watchdog on the slice does not depend on it
        host = self._host0()
        if tell_host and host.alive:
            try:
                host.send({"op": "idle", "busy": busy})
            except TransportError:
                pass  # a dead host 0: the next request restarts it, which is activity too

    @contextmanager
    def busy(self) -> Iterator[None]:
        """Busy while the body runs (host 0 holds the node), idle from its end."""
        self.mark(True, tell_host=True)
        try:
            yield
        finally:
            self.mark(False, tell_host=True)
