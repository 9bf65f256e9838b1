"""Ctrl-C during a request, counted instead of raised, and the inbox a request waits on.

Both live together because a press must end an inbox wait at once without losing a frame: the
wait is on a C-level queue of tokens, and the press raises ``Wake`` only inside that wait.
"""
from __future__ import annotations

import collections
import queue
import signal
import threading
import time
from typing import Any

try:  # the C functions under signal.signal and signal.getsignal, which convert to and from enums
    # by raising and catching ValueError: 8 us of every request (a cell, a push) against 0.6 us
    import _signal as _handlers
except ImportError:  # another Python: the same calls, slower
    _handlers = signal

#: what an inbox holds: (host index, message, blob)
Frame = tuple[int, dict, bytes]
#: the token of ``Inbox.ring``: the wait ends with or without a frame
_RUNG = object()


class Inbox:
    """The frames of one request: reader threads ``put``, the request's thread ``get``s.

    The wait is on a C-level queue of tokens, never on the frames themselves, so a Ctrl-C may end
    a wait at once (CtrlC raises Wake inside it) without ever losing a frame. A token is rung only
    for a frame that finds the inbox empty (a burst of frames costs one), so a frame taken without
    a wait leaves its token behind: a wait that wakes to such a token and no frame waits on, until
    its timeout. Producers add under a lock, so exactly the first frame after the inbox emptied
    rings: without it, two readers adding at once could both see a frame before theirs and neither
    ring, and the wait slept through them."""

    def __init__(self) -> None:
        self._items: collections.deque[Frame] = collections.deque()
        self._bell: queue.SimpleQueue = queue.SimpleQueue()
        self._adding = threading.Lock()

    def put(self, item: Frame) -> None:
        with self._adding:
            self._items.append(item)
            first = len(self._items) == 1  # only the consumer takes frames, never while it waits
        if first:
            self._bell.put(None)

    def ring(self) -> None:
        """End a wait without a frame (``Request.interrupt``, also from a signal handler)."""
        self._bell.put(_RUNG)

    def get(self, timeout: float, ctrl_c: CtrlC | None = None) -> Frame:
        """The next frame, waiting up to ``timeout``; queue.Empty if none came (or ``ring``)."""
        items = self._items
        deadline = None
        while not items:
            if ctrl_c is not None:
                ctrl_c.waiting = True
            try:
                token = self._bell.get(timeout=timeout)
            except queue.Empty:
                token = _RUNG
            finally:
                if ctrl_c is not None:
                    ctrl_c.waiting = False
            if items or token is _RUNG:
                break
            if deadline is None:  # a token a frame taken without a wait left: wait on
                deadline = time.monotonic() + timeout
            timeout = deadline - time.monotonic()
            if timeout <= 0:
                break
        try:
            return items.popleft()
        except IndexError:
            raise queue.Empty from None


class CtrlC:
    """Ctrl-C during a cell, counted instead of raised (on the main thread, while Python's own
    handler is in place): a KeyboardInterrupt inside tpunb's or paramiko's code could leave a
    half-sent frame and a raw traceback. A press during an Inbox wait ends that wait at once
    (Wake, raised only there); the session looks at ``presses`` after every wait."""

    def __init__(self) -> None:
        self.presses = 0
        self.waiting = False
        self._previous: Any = None

    def __enter__(self) -> CtrlC:
        if threading.current_thread() is threading.main_thread() and \
                _handlers.getsignal(signal.SIGINT) is signal.default_int_handler:
            self._previous = _handlers.signal(signal.SIGINT, self._press)
        return self

    def _press(self, signum, frame) -> None:
        self.presses += 1
        if self.waiting:
            self.waiting = False
            raise Wake()

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            _handlers.signal(signal.SIGINT, self._previous)


class Wake(Exception):
    """Ends an Inbox wait on Ctrl-C; never leaves the session."""
