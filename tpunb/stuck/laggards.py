"""Where laggards are, while a cell runs: once some hosts finished and others still run after
max(10 s, 3x the finished hosts' time), their stacks are read (on a side thread: the request's
wait never stops for it) and the cell's straggler line says where each one is, refreshed while
they run. A cell request's ``on_tick``."""
from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tpunb.engine.request import Request
    from tpunb.engine.cell import HeldSlice

#: a laggard is a host still running this long after the cell started...
AT_LEAST = 10.0
#: ...and this many times as long as the slowest host that finished took
TIMES = 3.0
#: seconds between two reads of the laggards' stacks while they run on
REFRESH = 5.0
#: a read of their stacks may take this long (a frozen host must not keep the others unsaid)
BOUND = 5.0


def lagging(request: "Request", now: float) -> list[int]:
    """The hosts that lag: some finished, these run on past max(AT_LEAST, TIMES x their time)."""
    if not request.finished or not request.pending:
        return []
    took = max(at - request.started for at in request.finished.values())
    return sorted(request.pending) if now - request.started >= max(AT_LEAST, TIMES * took) else []


class Laggards:
    """One cell's ``on_tick``: reads the laggards' stacks and hands ``{host: where}`` to its sink."""

    def __init__(self, sl: "HeldSlice") -> None:
        self.slice = sl
        self._read_at: float | None = None
        self._reading = False
        self._found: dict[int, str] | None = None  # from the side thread, given to the sink on a tick

    def __call__(self, request: "Request") -> None:
        found, self._found = self._found, None
        if found is not None:
            request.sink.laggards({h: w for h, w in found.items() if h in request.pending})
        now = time.monotonic()
        hosts = lagging(request, now)
        if not hosts or self._reading or (self._read_at is not None and now - self._read_at < REFRESH):
            return
        if self._read_at is None:
            self.slice.standbys.prepare()  # hosts lag far behind: a restart may follow
        self._reading, self._read_at = True, now
        threading.Thread(target=self._read, args=(hosts,), daemon=True, name="tpunb-laggards").start()

    def _read(self, hosts: list[int]) -> None:
        from tpunb.stuck import slice_stacks

        try:
            stacks = slice_stacks(self.slice, hosts, bound=BOUND)
            self._found = {h: stacks[h].short for h in hosts if h in stacks}
        except Exception:  # where laggards are is a courtesy: the cell runs on regardless
            self._found = None
        finally:
            self._reading = False
