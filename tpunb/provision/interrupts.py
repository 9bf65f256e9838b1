"""Ctrl-C that Python drops, caught again during a launch.

A KeyboardInterrupt raised while the main thread runs a gc callback (JAX registers one), a
``__del__`` or a weakref callback cannot propagate: CPython prints "Exception ignored" and goes
on, so one press would not stop a launch that polls the Cloud TPU API for minutes. While a launch
runs, such a dropped interrupt is latched here, and the launch's next poll (``check``) raises it
again, so its usual cleanup (delete what was created) runs.

A press during a create call is held until the call returns (``whole``): cut in the middle, the
call leaves the launch not knowing whether the resource exists, and the API may make it after the
cleanup looked for it, so nobody would delete it.
"""
from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from tpunb.engine.ctrl_c import CtrlC

T = TypeVar("T")

_dropped = threading.Event()


@contextlib.contextmanager
def latched() -> Iterator[None]:
    """While inside: a KeyboardInterrupt that Python dropped on the main thread is kept for ``check``."""
    previous = sys.unraisablehook

    def hook(unraisable) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt) and threading.current_thread() is threading.main_thread():
            _dropped.set()  # raised again at the next check; printing it would only alarm
            return
        previous(unraisable)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        if sys.unraisablehook is hook:
            sys.unraisablehook = previous
        _dropped.clear()


def check() -> None:
    """Raise the KeyboardInterrupt that Python dropped since the last check, if one was."""
    if _dropped.is_set():
        _dropped.clear()
        raise KeyboardInterrupt


def whole(call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``call(*args, **kwargs)`` with a Ctrl-C held until it returns, then raised as KeyboardInterrupt
    (the caller's cleanup then finds what the call made). A call that raises raises as it is."""
    with CtrlC() as held:
        result = call(*args, **kwargs)
    if held.presses:
        raise KeyboardInterrupt
    return result
