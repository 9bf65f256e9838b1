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

    def __init__(self, registry: "Registry", name: str, seconds: float | None, host0: Callable[[], Any],
                 boot_guard: bool = False) -> None:
        """``boot_guard``: host 0 runs a boot watchdog without an idle limit (a Compute Engine slice),
        which the first "not busy" told to host 0 (a launch or attach done) ends."""
        self._registry, self._name, self._seconds, self._host0 = registry, name, seconds, host0
        self._guarded = boot_guard

    def mark(self, busy: bool, tell_host: bool = False) -> None:
        """A request starts (``busy``) or ends; ``tell_host``: host 0's agent marks it too."""
        if not self._seconds:
            if self._guarded and tell_host and not busy:
                self._guarded = not self._tell(busy)
            return
        try:
            self._registry.mark_idle(self._name, self._seconds, busy)
        except OSError:
            pass  # the timer in %tpu_status lags; the watchdog on the slice does not depend on it
        if tell_host:
            self._tell(busy)

    def _tell(self, busy: bool) -> bool:
        """Host 0's agent marks it (True if it was told)."""
        host = self._host0()
        if not host.alive:
            return False
        try:
            host.send({"op": "idle", "busy": busy})
        except TransportError:
            return False  # a dead host 0: the next request restarts it, which is activity too
        return True

    @contextmanager
    def busy(self) -> Iterator[None]:
        """Busy while the body runs (host 0 holds the node), idle from its end."""
        self.mark(True, tell_host=True)
        try:
            yield
        finally:
            self.mark(False, tell_host=True)
