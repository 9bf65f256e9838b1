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
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

from tpunb import report
from tpunb.display import kernel_cell_number
from tpunb.errors import CellInterrupted, TpunbError, UsageError

if TYPE_CHECKING:
    from tpunb.engine.request import Request
    from tpunb.results import RunResult
    from tpunb.engine.session import Session
    from tpunb.engine.cell import Cell, HeldSlice


class Run(concurrent.futures.Future):
    """A cell running in the background, as a Future of its per-host results: ``done()``,
    ``result(timeout)``, ``exception()``, ``add_done_callback``; and ``wait(timeout)`` (a bool),
    ``interrupt()``, ``stacks()``. It runs (or waits its turn, with --queue) from the start, so
    ``cancel()`` is False: ``interrupt()`` stops it. Its cell's Request is made at once (the slice's
    session counts it as holding the hosts, or as in line for them); ``request`` shows it once it
    has its hosts."""

    def __init__(self, sl: "HeldSlice", code: str, cell: "Cell", label: str, has_hosts: bool = True) -> None:
        super().__init__()
        self.set_running_or_notify_cancel()
        self.slice = sl
        self.code = code
        self._cell = cell
        self.hosts = cell.request.hosts
        #: what the notebook calls the cell: ``In[7]``
        self.label = label
        self.started = time.monotonic()
        self._turn = threading.Event()  # it has its hosts (at once, or after a --queue wait)
        if has_hosts:
            self._turn.set()
        self._outcome: RunResult | None = None
        self._failure: BaseException | None = None
        cell.request.owner = self

    @property
    def request(self) -> "Request | None":
        """The cell's Request once it has its hosts (None while --queue waits its turn)."""
        return self._cell.request if self._turn.is_set() else None

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
        moves on at once (SIGTERM, SIGKILL, give up). Before it has its hosts (--queue), it never
        runs. Safe in a signal handler (the stop button's)."""
        self._cell.request.interrupt()

    def stacks(self, native: bool = False):
        """Where each of its hosts is now (``Slice.stacks`` of its hosts)."""
        return self.slice.stacks(hosts=self.hosts, native=native)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def describe(self) -> str:
        first = (self.code.strip().splitlines() or [""])[0][:60]
        state = "running in the background" if self._turn.is_set() else "waiting its turn (--queue)"
        return f"cell {self.label} ({first!r}), {state} for {self.elapsed():.0f} s"

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
    def _run(self, parent: Any, queue: bool, output: str | None) -> None:
        tokens = _route_output_here(parent)
        request = self._cell.request
        try:
            if queue and (not self.slice.cells.hold(self._cell, queue=True, given_up=lambda: request.presses > 0)
                          or request.presses):  # interrupted while its turn came: it never runs
                raise CellInterrupted(f"cell {self.label} was interrupted before it started")
            self._turn.set()
            self._outcome = self.slice.cells.execute(self.code, self.hosts, request.timeout, output, None,
                                                     shell=False, cell=self._cell)
            _show_end(self.slice, self._outcome, output)
        except BaseException as exc:  # kept for result(); said in the cell's own output area
            self._failure = exc
            self._outcome = getattr(exc, "results", None)
            _say(exc)
        finally:
            request.release()
            _unroute(tokens)
            if self._outcome is not None:  # a cell that failed on some hosts still has its results
                self.set_result(self._outcome)
            else:
                self.set_exception(self._failure or TpunbError(f"cell {self.label} ended without a result"))


class BackgroundCells:
    """One slice's background cells: the threads they run on, how they are numbered. Which hosts
    they hold is the session's to say (``Session.holding``); ``on_start`` is told of each new one
    (the kernel's ``tpunb.last_run()``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._started = 0
        self._workers: _Workers | None = None
        self.on_start: Callable[[Run], None] | None = None

    def start(self, sl: "HeldSlice", code: str, indices: list[int], timeout: float | None, output: str | None,
              queue: bool) -> Run:
        """Start ``code`` on these hosts of ``sl`` in the background; the Run at once. Its hosts are
        taken here (or it lines up for them, ``queue``), before anything else can ask for them."""
        cell = sl.cells.prepare(code, indices, timeout, output)
        if queue:
            sl.session.requests.line_up(cell.request)
        else:
            sl.cells.hold(cell)
            try:
                sl.revive(indices, mine=cell.request)  # its errors (hosts needing a restart, dead hosts): here, at once
            except BaseException:
                cell.request.release()
                raise
        count = kernel_cell_number()
        with self._lock:
            self._started += 1
            label = f"In[{count}]" if count is not None else f"run {self._started}"
            if self._workers is None:
                self._workers = _Workers()
            workers = self._workers
        run = Run(sl, code, cell, label, has_hosts=not queue)
        if self.on_start is not None:
            self.on_start(run)
        workers.submit(run._run, _cell_parent(), queue, output)
        return run


def interrupt_all(session: "Session") -> None:
    """Interrupt every background cell of a slice's session, running or in line (the stop button)."""
    for request in session.requests.in_flight():
        if isinstance(request.owner, Run):
            request.owner.interrupt()


def refuse_if_busy(sl: "HeldSlice", indices: list[int], mine: "Request | None" = None) -> None:
    """One line naming what holds these hosts (``Session.holding``), ``mine`` aside, and what to do."""
    held = [r for r in sl.session.holding(indices) if r is not mine]
    if held:
        raise busy_error(sl, held[0])


def busy_error(sl: "HeldSlice", holder: "Request") -> UsageError:
    """The line that says ``holder`` holds hosts another request asked for, and what to do."""
    many = len(holder.hosts) > 1
    hosts = f"host{'s' if many else ''} {sl.layout.names(holder.hosts)} {'are' if many else 'is'}"
    if isinstance(holder.owner, Run):
        return UsageError(f"{hosts} busy with {holder.owner.describe()}: wait for it (tpunb.last_run().wait()), "
                          "interrupt it (.interrupt()), or add --queue to run this cell after it")
    return UsageError(f"{hosts} busy with another {holder.kind} request (running for {holder.elapsed():.0f} s): wait "
                      "for it to end, or add --queue to run this cell after it")


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
