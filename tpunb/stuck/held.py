"""What tpunb.stuck asks of a slice this kernel holds: a ``Slice`` satisfies it, and it never
imports Slice (Slice imports it for its stacks and restarts)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from tpunb.display.hosts import Layout
    from tpunb.engine.standby import Standbys
    from tpunb.registry import SliceRecord
    from tpunb.session import Session


class HeldSlice(Protocol):
    """The members of ``tpunb.slice.Slice`` that stacks, background cells and restarts use."""

    session: "Session"
    layout: "Layout"
    record: "SliceRecord"
    standbys: "Standbys"
    background: Any  # its tpunb.engine.background.BackgroundCells (which names this protocol)

    @property
    def name(self) -> str: ...

    @property
    def num_hosts(self) -> int: ...

    def connect(self, hosts: list[int] | None = None, ready: dict | None = None) -> None: ...

    def revive(self, chosen: list[int] | None = None) -> list[int]: ...

    def save_hosts(self) -> None: ...

    def run(self, code: str, hosts: str | list[int] | None = None, timeout: float | None = None,
            output: str | None = "grouped", sink: Any = None, background: bool = False, queue: bool = False) -> Any: ...

    def execute(self, code: str, indices: list[int], timeout: float | None, output: str | None, sink: Any,
                shell: bool, started: Any = None) -> Any: ...

    def restart(self, hosts: str | list[int] | None = None) -> Any: ...
