"""One way to do a thing on many hosts (or zones) at once: connect, ask, list, start, end.

``fan_out(keys, fn)`` calls ``fn(key)`` for every key, each on a thread (at most ``workers`` at
once), and answers one ``GroupResult``: what each key returned, and what each key raised, as
Fabric's ``GroupResult`` does. Every caller gets the same three rules:

- **one deadline**: a key not done by ``deadline`` seconds fails with ``FanOutTimeout``; its
  thread is left to finish, and whatever it returns after that goes to ``late`` (a connection
  made too late is closed there, never leaked);
- **one Ctrl-C rule**: a KeyboardInterrupt in the waiting thread stops the wait at once and goes
  on to the caller; what was got already, and what finishes afterwards, goes to ``late`` too. The
  waiting thread never sleeps longer than ``WAKE`` at a time: a SIGINT whose C handler ran just
  before the sleep began, or on another thread, wakes no sleep, and Python raises it only once the
  thread runs bytecode again (without the bound, a Ctrl-C could wait for the slowest host);
- **partial failure**: one key's exception never hides another's result; the caller decides
  whether some failures are fine (``.failed``) or all must succeed (``.raise_first()``).

Threads are daemons, so a host that never answers cannot hold the interpreter's exit (as a
``ThreadPoolExecutor``'s would). tests/test_layout.py checks that thread pools and thread-per-host
loops live here (and in the engine's request), apart from a short list of long-lived threads.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from tpunb.errors import TpunbError

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")
#: the longest sleep of a thread that waits for hosts: a Ctrl-C its sleep missed is raised within it
WAKE = 0.1


class FanOutTimeout(TpunbError, TimeoutError):
    """A key's call did not end within the fan-out's deadline."""


@dataclass
class GroupResult(Generic[K, T]):
    """What a fan-out got: ``succeeded`` {key: value} and ``failed`` {key: exception}, in key order."""

    keys: list[K]
    succeeded: dict[K, T] = field(default_factory=dict)
    failed: dict[K, BaseException] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.failed

    def values(self) -> list[T]:
        """Every key's value, in key order; the first failure (in key order) is raised instead."""
        self.raise_first()
        return [self.succeeded[k] for k in self.keys]

    def by_key(self) -> dict[K, T]:
        """{key: value} for every key; the first failure (in key order) is raised instead."""
        self.raise_first()
        return dict(self.succeeded)

    def raise_first(self) -> None:
        for key in self.keys:
            if key in self.failed:
                raise self.failed[key]


def fan_out(keys: Sequence[K], fn: Callable[[K], T], deadline: float | None = None, workers: int = 64,
            name: str = "tpunb-fan-out", late: Callable[[T], Any] | None = None,
            after_failure: float | None = None, tick: float | None = None,
            on_tick: Callable[[], Any] | None = None) -> GroupResult[K, T]:
    """``fn(key)`` for every key at once (at most ``workers`` running), under one ``deadline`` in
    seconds (None: wait for all); see the module's rules. ``after_failure``: once a key fails, the
    others get at most this much longer (a launch that cannot succeed says so without waiting for
    every host). ``on_tick()`` is called from the waiting thread every ``tick`` seconds while keys
    run (progress bars: widgets want the notebook's thread)."""
    keys = list(keys)
    result: GroupResult[K, T] = GroupResult(keys)
    if not keys:
        return result
    lock = threading.Condition()
    todo = list(reversed(keys))
    done: set[K] = set()
    state: dict[str, Any] = {"waiting": True, "ends": None if deadline is None else time.monotonic() + deadline}

    def work() -> None:
        while True:
            with lock:
                if not todo or not state["waiting"]:
                    return
                key = todo.pop()
            try:
                value, error = fn(key), None
            except BaseException as exc:  # a thread's failure is its key's, whatever it is
                value, error = None, exc
            with lock:
                if state["waiting"]:
                    if error is None:
                        result.succeeded[key] = value
                    else:
                        result.failed[key] = error
                        if after_failure is not None:
                            soon = time.monotonic() + after_failure
                            state["ends"] = soon if state["ends"] is None else min(state["ends"], soon)
                    done.add(key)
                    lock.notify_all()
                    continue
            if error is None and late is not None:
                _quietly(late, value)

    every = tick if on_tick is not None else None
    try:
        for i in range(max(1, min(workers, len(keys)))):
            threading.Thread(target=work, daemon=True, name=f"{name}-{i}").start()
        with lock:
            next_tick = None if every is None else time.monotonic() + every
            while len(done) < len(keys):
                now = time.monotonic()
                left = None if state["ends"] is None else state["ends"] - now
                if left is not None and left <= 0:
                    break
                if next_tick is not None and every is not None and on_tick is not None and now >= next_tick:
                    lock.release()  # the tick may take its time (a widget): the workers go on meanwhile
                    try:
                        on_tick()
                    finally:
                        lock.acquire()
                    next_tick = time.monotonic() + every
                    continue
                sleep = WAKE if left is None else min(WAKE, left)
                lock.wait(sleep if next_tick is None else min(sleep, next_tick - now))
            state["waiting"] = False
    except BaseException:  # Ctrl-C: the caller never sees what was got, so it goes to ``late`` too
        with lock:
            state["waiting"] = False
            got = list(result.succeeded.values())
        for value in got if late is not None else ():
            _quietly(late, value)
        raise
    for key in keys:
        if key not in done:
            result.failed[key] = FanOutTimeout(f"no answer within {deadline:g} s" if after_failure is None or
                                               not result.failed else f"not done {after_failure:g} s after another failed")
    result.succeeded = {k: result.succeeded[k] for k in keys if k in result.succeeded}  # key order, not finish order
    result.failed = {k: result.failed[k] for k in keys if k in result.failed}
    return result


def _quietly(fn: Callable[[T], Any], value: T) -> None:
    try:
        fn(value)
    except Exception:  # cleaning up after a caller that stopped waiting: nobody to tell
        pass
