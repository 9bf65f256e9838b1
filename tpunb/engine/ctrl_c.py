"""Ctrl-C during a request, counted instead of raised, and the inbox a request waits on.

Both live together because a press must end an inbox wait at once without losing a frame: the
wait is on a C-level queue of tokens, and the press raises ``Wake`` only inside that wait.
"""
from __future__ import annotations

import collections
import queue
import signal
import threading
from typing import Any

#: what an inbox holds: (host index, message, blob)
Frame = tuple[int, dict, bytes]


class Inbox:
    """The frames of one request: reader threads ``put``, the request's thread ``get``s.

    The wait is on a C-level queue of tokens, never on the frames themselves, so a Ctrl-C may end
    a wait at once (CtrlC raises Wake inside it) without ever losing a frame."""

    def __init__(self) -> None:
        self._items: collections.deque[Frame] = collections.deque()
        self._bell: queue.SimpleQueue = queue.SimpleQueue()

    def put(self, item: Frame) -> None:
        ring = not self._items
        self._items.append(item)
        if ring:
            self._bell.put(None)

    def ring(self) -> None:
        """End a wait without a frame (``Request.interrupt`` from another thread)."""
        self._bell.put(None)

    def get(self, timeout: float, ctrl_c: CtrlC | None = None) -> Frame:
        """The next frame, waiting up to ``timeout``; queue.Empty if none came."""
        if not self._items:
            if ctrl_c is not None:
                ctrl_c.waiting = True
            try:
                self._bell.get(timeout=timeout)
            except queue.Empty:
                pass
            finally:
                if ctrl_c is not None:
                    ctrl_c.waiting = False
        try:
            return self._items.popleft()
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
                signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self._previous = signal.signal(signal.SIGINT, self._press)
        return self

    def _press(self, signum, frame) -> None:
        self.presses += 1
        if self.waiting:
            self.waiting = False
            raise Wake()

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


class Wake(Exception):
    """Ends an Inbox wait on Ctrl-C; never leaves the session."""
