"""Standby agents: a restart prepared ahead, so ``%tpu_restart`` takes a fraction of a second.

Most of an agent's start is Python importing IPython's shell. A standby is an agent started the
usual way (its own process, stream, watchdog and stack dump) that has done that and waits for its
settings; a restart ends the old agents and hands the standbys their settings instead of
starting new ones. Hosts without a live standby start cold, as before.

On a local or SSH slice a restart with no standby costs what ``%tpu_down`` plus ``%tpu_launch``
cost (both are an agent start), so by default (``TPUNB_STANDBY=eager``) every slice prepares
them once it is quiet: QUIET seconds after its start with no request running (a user reads the
first cell's output; a notebook's first cells are not slowed). Each is one more process per host,
with IPython imported and neither JAX nor the chips. Remote hosts each carry their own; on a local
slice they are processes on this machine, so only slices of at most EAGER_LOCAL_HOSTS hosts get
them ahead. ``TPUNB_STANDBY=likely`` prepares them only when a restart looks likely: after a
restart (for the next one), when a cell's hosts would not stop when interrupted, when laggards
show, when %tpu_stacks is asked (local slices of at most LOCAL_HOSTS hosts). ``TPUNB_STANDBY=0``
turns them off.
"""
from __future__ import annotations

import os
import threading
import time

from tpunb.engine.connection import HostConnection
from tpunb.errors import TransportError

#: the most hosts of a local slice (processes on this machine) that get standby agents
LOCAL_HOSTS = 16
#: the most hosts of a local slice that get them ahead, when no restart looks likely yet
EAGER_LOCAL_HOSTS = 8
#: seconds a slice is quiet (no request running) before its standbys are prepared ahead
QUIET = 2.0


def policy() -> str:
    """``TPUNB_STANDBY``: eager (the default; also 1, on, yes, true), likely, or off (0, no, false)."""
    value = os.environ.get("TPUNB_STANDBY", "eager").strip().lower()
    if value in ("0", "off", "no", "false"):
        return "off"
    return "likely" if value == "likely" else "eager"


def enabled() -> bool:
    return policy() != "off"


class Standbys:
    """One slice's standby agents, host -> a launched HostConnection awaiting its settings."""

    def __init__(self, session) -> None:
        self.session = session
        self._ready: dict[int, HostConnection] = {}
        self._lock = threading.Lock()
        self._preparing: threading.Thread | None = None
        self._waiting: threading.Thread | None = None
        self._closed = False

    def prepare_ahead(self, likely: bool = False) -> None:
        """Prepare every host's standby once the slice has been quiet for QUIET seconds (on a side
        thread; nothing to wait for here): under the eager policy, or when a restart is ``likely``
        (after one: its JAX start and the next cell go first)."""
        local = all(t.same_machine for t in self.session.transports)
        chosen = policy()
        if chosen == "off" or self._closed or (chosen == "likely" and not likely) or (
                local and len(self.session.hosts) > (LOCAL_HOSTS if likely else EAGER_LOCAL_HOSTS)):
            return
        with self._lock:
            if self._waiting is not None and self._waiting.is_alive():
                return
            self._waiting = thread = threading.Thread(target=self._prepare_when_quiet, args=(time.monotonic(),),
                                                      daemon=True, name="tpunb-standby-ahead")
            thread.start()

    def _prepare_when_quiet(self, since: float) -> None:
        if self.session.requests.wait_quiet(QUIET, lambda: self._closed or self.session.closed, since):
            self.prepare()

    def prepare(self, indices: list[int] | None = None, wait: bool = False) -> None:
        """Start a standby for each of these hosts (default all) that has none, on a side thread
        (``wait``: here); nothing when turned off, for large local slices, or once the slice closed."""
        hosts = self.session.hosts
        chosen = list(range(len(hosts)) if indices is None else indices)
        local = all(t.same_machine for t in self.session.transports)
        if not enabled() or self._closed or self.session.closed or (local and len(hosts) > LOCAL_HOSTS):
            return
        with self._lock:
            if self._preparing is not None and self._preparing.is_alive():
                return
            missing = [i for i in chosen if not self._usable(self._ready.get(i))]
            if not missing:
                return
            self._preparing = thread = threading.Thread(target=self._launch, args=(missing,), daemon=True,
                                                        name="tpunb-standby")
            thread.start()
        if wait:
            thread.join()

    def _launch(self, indices: list[int]) -> None:
        made = {}
        for i in indices:
            if self._closed:
                break
            standby = HostConnection(i, self.session.transports[i], _quiet, self.session.fanin,
                                     self.session.forks)
            try:
                standby.launch()
            except TransportError:
                continue  # unreachable now: a restart starts it cold (or says it cannot)
            made[i] = standby
        with self._lock:
            closed = self._closed
            if not closed:
                for i, standby in made.items():
                    old = self._ready.pop(i, None)
                    if old is not None:
                        _end(old)
                    self._ready[i] = standby
        if closed:  # the slice closed while these started: they end with it
            for thread in [_end(standby) for standby in made.values()]:
                thread.join()

    def ready(self) -> dict[int, HostConnection]:
        """host -> its standby, as it stands (for status and tests)."""
        with self._lock:
            return dict(self._ready)

    def wait_ready(self, timeout: float = 60.0) -> bool:
        """Wait until every standby being prepared has started (said hello); False at ``timeout``."""
        deadline = time.monotonic() + timeout
        preparing = self._preparing
        if preparing is not None:
            preparing.join(timeout)  # their start, then each one's hello: waited on, never polled
            if preparing.is_alive():
                return False
        return all(s.wait_greeted(max(0.0, deadline - time.monotonic())) for s in self.ready().values())

    def take(self, indices: list[int]) -> dict[int, HostConnection]:
        """The live standbys of these hosts, handed over (they are no longer kept here)."""
        taken = {}
        with self._lock:
            for i in indices:
                standby = self._ready.pop(i, None)
                if self._usable(standby):
                    taken[i] = standby
                elif standby is not None:
                    _end(standby)
        return taken

    def close(self) -> None:
        """End every standby, and prepare none from now on (the slice closes)."""
        with self._lock:
            self._closed = True
            standbys, self._ready = list(self._ready.values()), {}
            preparing = self._preparing
        if preparing is not None:
            preparing.join(30)  # it stops after the launch under way, and ends what it made
        for thread in [_end(s) for s in standbys]:
            thread.join()

    @staticmethod
    def _usable(standby: HostConnection | None) -> bool:
        process = standby.process if standby is not None else None
        return process is not None and process.exit_status() is None


def _end(standby: HostConnection) -> threading.Thread:
    """End a standby at once (it holds no state: no grace), on a thread of its own."""
    thread = threading.Thread(target=standby.close, args=(0.0,), daemon=True, name="tpunb-standby-end")
    thread.start()
    return thread


def _quiet(index: int, message: dict, blob: bytes) -> None:
    """A standby's frames before it takes its host's place: none matter (its death included)."""
