"""Who reads the session's frames on a host: the main thread between cells, a thread woken by
SIGIO while a cell runs.

Shipped to hosts: standard library only (see the package docstring).

Why: on a simulated slice of 256 hosts sharing two cores, a trivial cell costs a host mostly
the wake-ups it takes. A reader thread that reads every request and hands it to the main thread
is two wakes a cell (the reader's, then the main thread's), about a fifth of a host's CPU per
cell. So the main thread reads its own requests, blocked in ``read`` between cells, and a frame
that comes while a cell runs (an interrupt, a profiler request, a new heartbeat interval) wakes
another thread: the fd is in O_ASYNC mode, and for the cell's length its SIGIO goes to that thread
alone (F_SETOWN_EX with F_OWNER_TID; between cells to nobody), which blocks SIGIO and takes it in
``sigwait``. A cell with nothing to say to it costs two ``fcntl`` calls and a ``poll``, and no
wake. (Turning O_ASYNC itself on and off for each cell cost a host 40 us a cell, against 16: the
kernel allocates and RCU-frees its fasync entry every time.)

Where that is not available (not Linux), ``ThreadedInbox`` reads every frame on a thread of its
own, as before; ``TPUNB_AGENT_INBOX=thread`` asks for it anywhere.
"""
from __future__ import annotations

import collections
import fcntl
import os
import queue
import signal
import struct
import sys
import threading
from typing import Callable

from .io import Channel, quiet_thread

#: fcntl's F_SETOWN_EX with F_OWNER_TID (Linux): the fd's signals go to one thread, not the process;
#: with F_OWNER_PID 0, to nobody
F_SETOWN_EX, F_OWNER_TID, F_OWNER_PID = 15, 0, 1

#: dispatch(message, blob) -> True when the frame is a request for the main thread (exec, push, ...)
Dispatch = Callable[[dict, bytes], bool]


class _Inbox:
    def __init__(self, channel: Channel, dispatch: Dispatch, on_end: Callable[[], None]) -> None:
        self.channel, self.dispatch, self.on_end = channel, dispatch, on_end

    def _read_request(self) -> tuple[dict, bytes]:
        """Read (dispatching every other frame) until a request comes; the end of the stream
        ends the host."""
        while True:
            try:
                frame = self.channel.recv()
            except Exception:
                frame = None
            if frame is None:
                self.on_end()
            if self.dispatch(*frame):
                return frame


class ThreadedInbox(_Inbox):
    """A reader thread reads every frame, dispatches it, and queues requests for the main thread."""

    kind = "thread"

    def __init__(self, channel: Channel, dispatch: Dispatch, on_end: Callable[[], None]) -> None:
        super().__init__(channel, dispatch, on_end)
        self._requests: queue.SimpleQueue = queue.SimpleQueue()  # C-level: a cheap hand-over

    def start(self) -> None:
        quiet_thread(self._run, "tpunb-reader")

    def _run(self) -> None:
        while True:
            self._requests.put(self._read_request())

    def next_request(self) -> tuple[dict, bytes]:
        return self._requests.get()

    def cell_started(self) -> None:
        pass

    def cell_ended(self) -> None:
        pass


class SignalledInbox(_Inbox):
    """The main thread reads between cells; while a cell runs, a thread woken by SIGIO does."""

    kind = "sigio"

    def __init__(self, channel: Channel, dispatch: Dispatch, on_end: Callable[[], None]) -> None:
        super().__init__(channel, dispatch, on_end)
        self._lock = threading.Lock()  # held by the SIGIO thread while it reads
        self._in_cell = False
        self._held: collections.deque = collections.deque()  # requests the SIGIO thread read
        self._thread: threading.Thread | None = None
        self._to_thread = self._to_nobody = struct.pack("ii", F_OWNER_PID, 0)

    def start(self) -> None:
        """Start the SIGIO thread and point the fd's signals at it; OSError where that is refused."""
        started = threading.Event()
        tid: list[int] = []

        def run() -> None:
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGIO})  # taken by sigwait, never delivered
            tid.append(threading.get_native_id())
            started.set()
            self._run()

        self._thread = quiet_thread(run, "tpunb-sigio")
        started.wait()
        self._to_thread = struct.pack("ii", F_OWNER_TID, tid[0])
        fd = self.channel.in_fd
        fcntl.fcntl(fd, F_SETOWN_EX, self._to_nobody)  # refused where F_SETOWN_EX is not known
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_ASYNC)

    def _run(self) -> None:
        while True:
            signal.sigwait({signal.SIGIO})
            with self._lock:
                if not self._in_cell:  # a late signal: the main thread reads again
                    continue
                try:
                    frames = self.channel.recv_ready()
                except Exception:
                    frames = None
                if frames is None:
                    self.on_end()
                for frame in frames:
                    if self.dispatch(*frame):
                        self._held.append(frame)

    def next_request(self) -> tuple[dict, bytes]:
        return self._held.popleft() if self._held else self._read_request()

    def cell_started(self) -> None:
        self._in_cell = True
        fcntl.fcntl(self.channel.in_fd, F_SETOWN_EX, self._to_thread)
        if self.channel.has_frames():  # came before the signal had an owner: none was sent for it
            signal.pthread_kill(self._thread.ident, signal.SIGIO)

    def cell_ended(self) -> None:
        fcntl.fcntl(self.channel.in_fd, F_SETOWN_EX, self._to_nobody)
        with self._lock:  # the SIGIO thread is not reading now, and will not until the next cell
            self._in_cell = False


def make_inbox(channel: Channel, dispatch: Dispatch, on_end: Callable[[], None]):
    """The SIGIO inbox where the platform has what it needs, else the reader thread; started."""
    if (os.environ.get("TPUNB_AGENT_INBOX") != "thread" and sys.platform.startswith("linux")
            and hasattr(os, "O_ASYNC") and hasattr(signal, "sigwait")):
        inbox = SignalledInbox(channel, dispatch, on_end)
        try:
            inbox.start()
            return inbox
        except OSError:  # the thread stays, asleep in sigwait; no signal will reach it
            pass
    inbox = ThreadedInbox(channel, dispatch, on_end)
    inbox.start()
    return inbox
