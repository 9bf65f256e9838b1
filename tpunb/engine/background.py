"""``%%on_tpu --bg``: a cell that runs on its hosts while the notebook goes on.

The cell's request runs on a thread of its own (threads are kept between background cells); its
output streams, labelled as in the foreground, into the output area of the cell that started it: the thread takes that cell's
parent header (ipykernel's thread-local parent), so prints, displays and the straggler line
land there while other cells run. What it returns is a ``Run`` handle (``tpunb.last_run()``): a
``concurrent.futures.Future``, as ipyparallel's AsyncResult is, so ``asyncio.wrap_future``,
``concurrent.futures.as_completed`` and ``add_done_callback`` work on it.

While it runs, magics that do not need the hosts' main thread keep working (%tpu_metrics,
%tpu_status, %tpu_stacks); a second cell, push or pull on its hosts is refused in one line
naming it, or waits for it with ``--queue``. The kernel's interrupt (the stop button) interrupts
it when no other cell runs, as it would a foreground cell.
"""
from __future__ import annotations

import concurrent.futures
import queue as queues
import signal
import sys
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Callable

from tpunb import report
from tpunb.display import kernel_cell_number
from tpunb.errors import CellInterrupted, TpunbError, UsageError

if TYPE_CHECKING:
    from tpunb.engine.request import Request
    from tpunb.results import RunResult
    from tpunb.stuck.held import HeldSlice


class Run(concurrent.futures.Future):
    """A cell running in the background, as a Future of its per-host results: ``done()``,
    ``result(timeout)``, ``exception()``, ``add_done_callback``; and ``wait(timeout)`` (a bool),
    ``interrupt()``, ``stacks()``. It runs (or waits its turn, with --queue) from the start, so
    ``cancel()`` is False: ``interrupt()`` stops it."""

    def __init__(self, sl: "HeldSlice", code: str, hosts: list[int], label: str) -> None:
        super().__init__()
        self.set_running_or_notify_cancel()
        self.slice = sl
        self.code = code
        self.hosts = hosts
        #: what the notebook calls the cell: ``In[7]``
        self.label = label
        self.started = time.monotonic()
        self.request: Request | None = None  # set once the cell is sent (after a --queue wait)
        self._outcome: RunResult | None = None
        self._failure: BaseException | None = None
        self._interrupts = 0
        self._interrupt_lock = threading.RLock()  # re-entered by the stop button's signal handler
        self._worker: int | None = None  # the thread it runs on (its ident), once it runs

    # -- the handle ---------------------------------------------------------------------------
    def wait(self, timeout: float | None = None) -> bool:
        """Wait until it ends; False if ``timeout`` seconds passed first."""
        concurrent.futures.wait([self], timeout)
        return self.done()

    def result(self, timeout: float | None = None) -> "RunResult":
        """The per-host results (values, errors, output), as ``tpunb.last_result()`` gives a
        foreground cell's; TimeoutError if it has not ended within ``timeout`` seconds."""
        if not self.wait(timeout):
            raise TimeoutError(f"cell {self.label} still runs on hosts {self.slice.layout.names(self.hosts)} "
                               f"({self.elapsed():.0f} s): wait longer, or .interrupt() it")
        return super().result()

    def cancel(self) -> bool:
        """A background cell is already running (or queued to): ``interrupt()`` stops it."""
        return False

    def interrupt(self) -> None:
        """Interrupt it on every host, as the stop button does a foreground cell; each further call
        moves on at once (SIGTERM, SIGKILL, give up)."""
        with self._interrupt_lock:
            self._interrupts += 1
            request = self.request
        if request is not None:
            request.interrupt()

    def stacks(self, native: bool = False):
        """Where each of its hosts is now (``Slice.stacks`` of its hosts)."""
        return self.slice.stacks(hosts=self.hosts, native=native)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def holds(self, hosts: list[int]) -> bool:
        return not self.done() and bool(set(self.hosts) & set(hosts))

    def describe(self) -> str:
        first = (self.code.strip().splitlines() or [""])[0][:60]
        return f"cell {self.label} ({first!r}), running in the background for {self.elapsed():.0f} s"

    def __repr__(self) -> str:
        hosts = self.slice.layout.names(self.hosts)
        if not self.done():
            return (f"<tpunb Run {self.label} on host{'s' if len(self.hosts) > 1 else ''} {hosts}: running "
                    f"{self.elapsed():.1f} s; .done() .wait() .result() .interrupt() .stacks()>")
        outcome = repr(self._outcome) if self._outcome is not None else f"failed: {self._failure}"
        return f"<tpunb Run {self.label}: {outcome}>"

    def _repr_pretty_(self, printer, cycle: bool) -> None:
        printer.text(repr(self))

    # -- the thread ---------------------------------------------------------------------------
    def _run(self, parent: Any, queue: bool, timeout: float | None, output: str | None) -> None:
        self._worker = threading.get_ident()
        tokens = _route_output_here(parent)
        try:
            if queue:
                self.slice.background.wait_for_hosts(self.hosts, self)
            if self._interrupts:  # interrupted while it waited in the queue: it never ran
                raise CellInterrupted(f"cell {self.label} was interrupted before it started")
            self._outcome = self.slice.execute(self.code, self.hosts, timeout, output, None, shell=False,
                                               started=self._sent)
            _show_end(self.slice, self._outcome, output)
        except BaseException as exc:  # kept for result(); said in the cell's own output area
            self._failure = exc
            self._outcome = getattr(exc, "results", None)
            _say(exc)
        finally:
            self.slice.background.ended(self)
            _unroute(tokens)
            if self._outcome is not None:  # a cell that failed on some hosts still has its results
                self.set_result(self._outcome)
            else:
                self.set_exception(self._failure or TpunbError(f"cell {self.label} ended without a result"))

    def _sent(self, request: "Request") -> None:
        """The cell's request exists: from now on interrupt() reaches it (also presses made before)."""
        with self._interrupt_lock:
            self.request = request
            earlier = self._interrupts
        for _ in range(earlier):
            request.interrupt()


class BackgroundCells:
    """One slice's background cells: which run (and hold which hosts), the threads they run on.
    ``on_start`` is told of each new one (the kernel's ``tpunb.last_run()``)."""

    def __init__(self) -> None:
        self._runs: list[Run] = []
        self._lock = threading.Lock()
        self._started = 0
        self._workers: _Workers | None = None
        self.on_start: Callable[[Run], None] | None = None

    def running(self) -> list[Run]:
        with self._lock:
            return list(self._runs)

    def start(self, sl: "HeldSlice", code: str, indices: list[int], timeout: float | None, output: str | None,
              queue: bool) -> Run:
        """Start ``code`` on these hosts of ``sl`` in the background; the Run at once."""
        if not queue:
            self.refuse_if_busy(sl, indices)
            sl.revive(indices)  # its errors (hosts that need a restart, dead hosts) are said here, at once
        count = kernel_cell_number()
        with self._lock:
            self._started += 1
            run = Run(sl, code, indices, f"In[{count}]" if count is not None else f"run {self._started}")
            self._runs.append(run)
            if self._workers is None:
                self._workers = _Workers()
            workers = self._workers
        if self.on_start is not None:
            self.on_start(run)
        _stop_button_interrupts(self)
        workers.submit(run._run, _cell_parent(), queue, timeout, output)
        return run

    def ended(self, run: Run) -> None:
        with self._lock:
            if run in self._runs:
                self._runs.remove(run)

    def busy(self, indices: list[int]) -> list[Run]:
        """Background cells (other than the caller's own) that hold any of these hosts."""
        me = threading.get_ident()
        return [r for r in self.running() if r._worker != me and r.holds(indices)]

    def refuse_if_busy(self, sl: "HeldSlice", indices: list[int]) -> None:
        """One line naming the background cell that holds these hosts, and what to do."""
        held = self.busy(indices)
        if held:
            run = held[0]
            raise UsageError(f"host{'s' if len(run.hosts) > 1 else ''} {sl.layout.names(run.hosts)} "
                             f"{'are' if len(run.hosts) > 1 else 'is'} busy with {run.describe()}: wait for it "
                             "(tpunb.last_run().wait()), interrupt it (.interrupt()), or add --queue to run this "
                             "cell after it")

    def wait_for_hosts(self, indices: list[int], me: Run | None = None) -> None:
        """Wait until no background cell started before this one holds these hosts (``--queue``)."""
        while True:
            ahead = [r for r in self.busy(indices) if me is None or r.started < me.started]
            if not ahead:
                return
            ahead[0].wait(0.5)  # a press of Ctrl-C (foreground) ends this wait with KeyboardInterrupt

    def interrupt_all(self) -> None:
        for run in self.running():
            run.interrupt()


class _Workers:
    """Daemon threads that run background cells, kept between cells so that starting one does not
    wait for a new thread to start; one more is made when all are busy. (Not an executor: its
    threads would hold the kernel's exit until a hung cell ends.)"""

    def __init__(self) -> None:
        self._jobs: queues.SimpleQueue = queues.SimpleQueue()
        self._idle = 0
        self._lock = threading.Lock()

    def submit(self, job, *args) -> None:
        with self._lock:
            spawn = self._idle == 0
            self._idle -= 0 if spawn else 1
        self._jobs.put((job, args))
        if spawn:
            threading.Thread(target=self._serve, daemon=True, name="tpunb-bg").start()

    def _serve(self) -> None:
        while True:
            job, args = self._jobs.get()
            job(*args)
            with self._lock:
                self._idle += 1



# -- output to the cell that started it --------------------------------------------------------
def _cell_parent() -> Any:
    """The parent header of the cell running now (ipykernel), or None."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    shell = get_ipython()
    if shell is None or getattr(shell, "kernel", None) is None:
        return None
    getter = getattr(shell, "get_parent", None) or getattr(shell.kernel, "get_parent", None)
    return getter() if getter is not None else None


def _route_output_here(parent: Any) -> list:
    """From this thread on, output goes to the cell of ``parent`` (ipykernel's thread-local parent):
    its streams, displays and display updates. Undone with ``_unroute``."""
    if parent is None:
        return []
    from IPython import get_ipython

    shell = get_ipython()
    if hasattr(shell, "set_thread_parent") and hasattr(shell, "reset_thread_parent"):
        return [(shell.reset_thread_parent, shell.set_thread_parent(parent))]
    tokens = []
    for obj in (sys.stdout, sys.stderr, getattr(shell, "display_pub", None), getattr(shell, "displayhook", None)):
        setter = getattr(obj, "set_thread_parent", None)
        if setter is not None:
            tokens.append((obj.reset_thread_parent, setter(parent)))
    if not tokens and report.once("background output routing"):
        report.warn("[tpunb] this kernel cannot send a background cell's output to its own cell (ipykernel < 7): "
                    "it shows in whichever cell runs when it arrives; .result() of the cell's handle has all of it")
    return tokens


def _unroute(tokens: list) -> None:
    for reset, token in reversed(tokens):
        try:
            reset(token)
        except (ValueError, RuntimeError):
            pass


def _show_end(sl: "HeldSlice", result: "RunResult", output: str | None) -> None:
    """What a foreground cell shows at its end: values, then the errors and notes in one go."""
    from tpunb.display import render_values

    if output:
        render_values(result, output, sl.num_hosts, names=sl.layout.names)
    try:
        result.raise_for_status()
    except TpunbError as exc:
        _say(exc)


def _say(exc: BaseException) -> None:
    """An error of a background cell, in its own output area, as IPython would show it."""
    render = getattr(exc, "_render_traceback_", None)
    lines = render() if render is not None else [f"{type(exc).__name__}: {exc}"]
    sys.stderr.write("\n".join(lines) + "\n")
    sys.stderr.flush()


# -- the stop button -------------------------------------------------------------------------
def _stop_button_interrupts(cells: BackgroundCells) -> None:
    """In a Jupyter kernel, SIGINT while no cell runs is ignored; from the first background cell on,
    it interrupts the background cells instead (while a cell runs, ipykernel's own handler is in
    place and interrupts that cell). Outside a kernel (a terminal, where Ctrl-C belongs to the
    prompt) nothing changes: use the handle's interrupt(). The handler the kernel restores holds
    every slice's background cells (``handler.cells``)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return
    kernel = getattr(get_ipython(), "kernel", None)
    saved = getattr(kernel, "saved_sigint_handler", None)
    held = getattr(saved, "cells", None)
    if held is not None:  # ours, installed by another slice's first background cell
        held.add(cells)
        return
    # ipykernel puts its own handler in place while it runs a cell and restores the one it saved
    # (SIG_IGN) after: ours is what it restores from now on
    if saved is signal.SIG_IGN:
        kernel.saved_sigint_handler = _Interrupter(cells)


class _Interrupter:
    """The stop button's handler between cells: interrupts every held slice's background cells."""

    def __init__(self, cells: BackgroundCells) -> None:
        self.cells: weakref.WeakSet[BackgroundCells] = weakref.WeakSet([cells])

    def __call__(self, signum, frame) -> None:
        for cells in list(self.cells):
            cells.interrupt_all()
