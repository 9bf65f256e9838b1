"""A cell held for a slice: its request and where its output goes (``Cell``), beside the request
itself; and what tpunb.stuck asks of a slice this kernel holds (``HeldSlice``: a ``Slice``
satisfies it, and it never imports Slice, which imports it for its stacks and restarts)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from tpunb.display.sink import OutputSink
    from tpunb.engine.request import Request
    from tpunb.display.hosts import Layout
    from tpunb.engine.standby import Standbys
    from tpunb.registry import SliceRecord
    from tpunb.engine.session import Session


@dataclass
class Cell:
    """A cell's request, made and not sent yet (``Cells.prepare``), with the sink its output
    goes to and, for hosts that would not stop, where each one was (``show_stuck`` fills it)."""

    request: "Request"
    sink: "OutputSink"
    where: dict[int, str] = field(default_factory=dict)


class HeldSlice(Protocol):
    """The members of ``tpunb.slice.Slice`` that stacks, cells (background ones too) and restarts use."""

    session: "Session"
    layout: "Layout"
    record: "SliceRecord"
    standbys: "Standbys"
    background: Any  # its tpunb.engine.background.BackgroundCells (which names this protocol)
    cells: Any  # its tpunb.slice.cells.Cells: prepare, hold, execute a cell
    cell_logs: Any  # its tpunb.display.HostLogs
    idle: Any  # its tpunb.status.idle_clock.IdleClock
    node: Any  # what outlives its host processes (tpunb.slice.Node)
    last_result: Any  # the RunResult of its last cell

    @property
    def name(self) -> str: ...

    @property
    def num_hosts(self) -> int: ...

    def connect(self, hosts: list[int] | None = None, ready: dict | None = None) -> None: ...

    def revive(self, chosen: list[int] | None = None, mine: Any = None) -> list[int]: ...

    def save_hosts(self) -> None: ...

    def run(self, code: str, hosts: str | list[int] | None = None, timeout: float | None = None,
            output: str | None = "grouped", sink: Any = None, background: bool = False, queue: bool = False) -> Any: ...

    def restart(self, hosts: str | list[int] | None = None, jax: bool = True) -> Any: ...
