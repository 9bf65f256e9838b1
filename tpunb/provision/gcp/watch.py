"""The watch every cloud slice's side keeps, whichever API made it: before each cell, and every
watch interval from a thread even while no cell runs, it asks whether the slice's hosts are gone
for good (preempted, deleted, stopped), and says so once, with what to do.
"""
from __future__ import annotations

import os
import threading
import time

from tpunb import report
from tpunb.errors import ProvisionError, TpunbError
from tpunb.provision.gcp import failures as gcp_errors
from tpunb.slice import Node

FRESH_SECONDS = 10.0  # a state this recent is trusted before a cell without asking the API again


def watch_interval() -> float:
    return float(os.environ.get("TPUNB_WATCH_INTERVAL", "30"))


class WatchedNode(Node):
    """A cloud slice's side that knows whether its hosts are gone for good (``refresh`` asks the
    cloud, ``lost_reason`` reads the answer): said before each cell, and once by a watch thread
    that looks every watch interval even while no cell runs."""

    name: str
    checked_at = 0.0
    #: what the watch says it cannot look at when a refresh fails
    WATCHED = "its node for preemption"

    def _start_watch(self, watch: bool = True) -> None:
        """Its watch state, and (``watch``) the thread; a status view's copy has no thread."""
        self._reported = False
        self._blind = False  # the watch said it cannot see the node; quiet until it can again
        self.watch_failures = 0  # watch rounds that could not read the node
        self._stop = threading.Event()
        if watch:
            threading.Thread(target=self._watch, daemon=True, name=f"tpunb-watch-{self.name}").start()

    def refresh(self):
        raise NotImplementedError

    def lost_reason(self) -> str | None:
        raise NotImplementedError

    def advice(self) -> str:
        return f"Relaunch it with %tpu_launch --recover {self.name}, or delete it with %tpu_down {self.name}"

    def check(self, fresh: bool = False) -> None:
        if fresh or time.monotonic() - self.checked_at > FRESH_SECONDS:
            try:
                self.refresh()
            except ProvisionError:
                return  # the API is unreachable: let the cell try the hosts themselves
        reason = self.lost_reason()
        if reason:
            self._reported = True
            raise ProvisionError(f"slice {self.name} cannot run cells: {reason}. {self.advice()}", "lost")

    def explain_deaths(self) -> str | None:
        try:
            self.refresh()
        except TpunbError:
            return None
        reason = self.lost_reason()
        return f"slice {self.name}: {reason}; relaunch it with %tpu_launch --recover {self.name}" if reason else None

    def _watch(self) -> None:
        """Refresh the state every watch interval; say a preemption once, and once that the node
        cannot be watched (and why) until a refresh works again. Cells check the node anyway."""
        while not self._stop.wait(watch_interval()):
            try:
                self.refresh()
            except Exception as exc:  # permissions, API off, network: try again next round
                self.watch_failures += 1
                if not self._blind:
                    self._blind = True
                    why = gcp_errors.one_line(str(exc) or type(exc).__name__, 160)
                    report.warn(f"[tpunb] slice {self.name}: cannot watch {self.WATCHED} ({why}); "
                                f"trying again every {watch_interval():g} s, and before each cell")
                continue
            self._blind = False
            reason = self.lost_reason()
            if reason and not self._reported:
                self._reported = True
                report.warn(f"[tpunb] slice {self.name}: {reason}. %tpu_launch --recover {self.name} relaunches it; "
                            f"%tpu_down {self.name} deletes it")

    def close(self) -> None:
        self._stop.set()
