"""How a cell runs on a slice's hosts, foreground or background: made (numbered as the notebook's
cell, coloured as its tracebacks), its hosts taken, revived, its output streamed, an interrupt
turned into one error, and the per-host result kept as the slice's ``last_result``. ``Cells`` is
what ``tpunb.engine.background`` drives for ``block=False`` cells; ``HostsView.run`` is the one
verb users call."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable

from tpunb import report, stuck
from tpunb.display import CellOutput, LogOnly, OutputSink, kernel_cell_number, kernel_colors
from tpunb.display.output import show_between_cells
from tpunb.engine.background import busy_error
from tpunb.engine.cell import Cell
from tpunb.errors import CellInterrupted, UsageError
from tpunb.results import RunResult
from tpunb.stuck.laggards import Laggards

if TYPE_CHECKING:
    from tpunb.engine.cell import HeldSlice


class Cells:
    """One slice's cells: ``prepare`` makes a cell's request without sending it, ``hold`` takes its
    hosts, ``execute`` runs it to its result."""

    def __init__(self, sl: "HeldSlice") -> None:
        self.slice = sl

    def prepare(self, code: str, indices: list[int], timeout: float | None, output: str | None,
                sink: OutputSink | None = None, shell: bool = False) -> Cell:
        """A cell's request, made and not sent: ``hold`` takes its hosts, ``execute`` runs it."""
        sl = self.slice
        if timeout is not None and not (0 < timeout < math.inf):
            raise UsageError(f"timeout must be a positive number of seconds, not {timeout}")
        if sink is None:
            sink = (CellOutput(indices, sl.num_hosts, output, sl.cell_logs, names=sl.layout.names) if output
                    else LogOnly(sl.cell_logs))
        sl.session.colors = kernel_colors()  # hosts colour tracebacks as this kernel does
        where: dict[int, str] = {}  # hosts that would not stop: where they were (tpunb.stuck)
        request = sl.session.cell(code, indices, timeout, sink, shell=shell, count=kernel_cell_number(),
                                  on_stuck=lambda r, hosts: stuck.show_stuck(sl, hosts, r.sink, where),
                                  on_tick=Laggards(sl) if len(indices) > 1 else None)
        return Cell(request, sink, where)

    def hold(self, cell: Cell, queue: bool = False, given_up: Callable[[], bool] | None = None) -> bool:
        """Take the cell's hosts (``Session.holding`` counts it from now on): refused in one line
        naming what holds them, or with ``queue`` once they are free; False if ``given_up()`` first."""
        held = self.slice.session.requests.claim(cell.request, queue, given_up)
        if held and not queue:
            raise busy_error(self.slice, held[0])
        return not held

    def execute(self, code: str, indices: list[int], timeout: float | None, output: str | None,
                sink: OutputSink | None, shell: bool, queue: bool = False, cell: Cell | None = None) -> RunResult:
        """Take the hosts (``hold``; ``queue``: wait for them), revive them, stream output, turn an
        interrupt into one error. ``cell``: prepared already, its hosts held (a background cell)."""
        if cell is None:
            cell = self.prepare(code, indices, timeout, output, sink, shell)
            self.hold(cell, queue)
        try:
            return self._run(code, indices, timeout, shell, cell)
        finally:
            cell.request.release()

    def _run(self, code: str, indices: list[int], timeout: float | None, shell: bool, cell: Cell) -> RunResult:
        sl, request, sink, where = self.slice, cell.request, cell.sink, cell.where
        sl.revive(indices, mine=request)
        show_between_cells(sl.session.backlog, sl.cell_logs, sl.layout.name)
        self.say_jax_failures()
        sl.cell_logs.begin_cell(indices, "$ " + code if shell else code)
        sl.idle.mark(True, tell_host=True)
        try:
            results = stuck.with_where(request.run(), where)
        except CellInterrupted as exc:
            sink.finish()
            self.say_jax_failures()
            result = sl.last_result = RunResult(stuck.with_where(exc.results, where), names=sl.layout.names)
            stopped = result.hosts_with("interrupted")
            message = (f"interrupted on host{'s' if len(stopped) != 1 else ''} {sl.layout.names(stopped)}; "
                       f"{'their' if len(stopped) != 1 else 'its'} state is kept"
                       if stopped else "interrupted")
            raise CellInterrupted("; ".join([message] + [n for n in result.notes() if "stopped cleanly" not in n]),
                                  result) from None
        finally:
            sl.idle.mark(False, tell_host=True)
        sink.finish()
        self.say_jax_failures()
        sl.last_result = RunResult(results, timeout, names=sl.layout.names)
        if sl.last_result.hosts_with("died"):
            note = sl.node.explain_deaths()  # e.g. the cloud says the node was preempted
            if note:
                sl.last_result.extra_notes.append(note)
        return sl.last_result

    def say_jax_failures(self) -> None:
        """Hosts that failed to join JAX when another host started it (no cell of theirs shows it)."""
        sl = self.slice
        for host, error in sorted(sl.session.take_jax_failures().items()):
            name = sl.layout.name(host)
            reason = (error.strip().splitlines() or ["no reason given"])[0][:300]
            report.warn(f"[tpunb] host {name} could not start JAX when another host did ({reason}): JAX collectives "
                        f"over the slice will wait for it; fix the cause, then run exit() on it (%%on_tpu --hosts "
                        f"{name}) to restart the slice's hosts")
