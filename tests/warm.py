"""Warm slices: slices the tests that do not change them share, one per transport, host count and
JAX, made once per test session (per pytest-xdist worker) instead of once per test.

A test borrows one through ``make_slice`` (conftest.py) unless it is marked ``fresh_slice``:
it gets the slice as the current one of the kernel's manager and of its own $TPUNB_HOME, and
gives it back afterwards. Between two tests the slice is reset by one host op (``Slice.reset``:
empty namespaces, the environment and working directory as the session started), never a restart.
What a reset cannot undo is checked: a test that left services, port forwards, running or
waiting requests (background cells), changed variables, files in the hosts' folders, changed
settings, or dead, deleted or closed hosts fails, and the slice is replaced for the next test.

A warm slice lives in a $TPUNB_HOME of its own (its registry, logs and hosts' home), so the test's
home holds only a copy of its record: %tpu_status, %tpu_use and the sidebar's model see it there.
"""
from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from tpunb import manager
from tpunb.registry import Registry
from tpunb.slice import Slice


@dataclasses.dataclass(frozen=True)
class Key:
    """Which warm slice: its transport, its number of hosts, and whether its hosts run JAX."""

    transport: str
    hosts: int
    jax: bool

    @property
    def folder(self) -> str:
        return f"{self.transport}-{self.hosts}{'-jax' if self.jax else ''}"


@dataclasses.dataclass
class Warm:
    """One warm slice and what it looked like when it was made: what every test gives back."""

    slice: Slice
    env: dict[str, str]
    folders: dict[int, dict]  # what lay in the hosts' tpunb folders when the test borrowed it
    settings: dict[str, float]


def settings_of(sl: Slice) -> dict[str, float]:
    """The slice's settings a test may change on it."""
    session = sl.session
    return {"heartbeat_timeout": session.heartbeat_timeout, "interrupt_grace": session.interrupt_grace,
            "term_grace": session.term_grace, "metrics_interval": sl.metrics_interval}


class Pool:
    """The warm slices of one test session, each in a home of its own under ``root``."""

    #: every pool of this process (one a session), for tests that count a kernel's own processes
    pools: list[Pool] = []

    def __init__(self, root: Path) -> None:
        self.root = root
        self.warm: dict[Key, Warm] = {}
        #: True while the pool itself starts a slice (conftest's fresh-slice guard lets it)
        self.making = False
        Pool.pools.append(self)

    @classmethod
    def every_warm_slice(cls) -> list[Slice]:
        return [w.slice for pool in cls.pools for w in pool.warm.values()]
        #: True while the pool itself starts a slice (conftest's fresh-slice guard lets it)
        self.making = False

    def borrow(self, key: Key, make: Callable[[], Slice]) -> Slice:
        """The warm slice for ``key`` (made by ``make`` if there is none), attached as the
        current slice of this kernel and recorded in the test's $TPUNB_HOME."""
        warm = self.warm.get(key)
        if warm is None:
            warm = self.warm[key] = self._make(key, make)
        sl = warm.slice
        warm.folders = {i: f["folders"] for i, f in sl.reset().items()}  # what other tests left: not this one's
        Registry().save_slice(sl.record)
        kernel = manager.MANAGER
        kernel.attached[sl.name] = sl
        kernel.current_name = sl.name
        kernel.env[sl.name] = dict(warm.env)
        return sl

    def _make(self, key: Key, make: Callable[[], Slice]) -> Warm:
        home = Path(tempfile.mkdtemp(prefix=f"{key.folder}-", dir=self.root))  # a fresh registry: no old host keys
        kernel = manager.MANAGER
        before = os.environ.get("TPUNB_HOME")
        os.environ["TPUNB_HOME"] = str(home)
        self.making = True
        try:
            sl = make()
        finally:
            self.making = False
            os.environ["TPUNB_HOME"] = before if before is not None else str(home)
        env = kernel.env.get(sl.name, {})
        self._let_go(sl)
        found = sl.reset()
        return Warm(sl, dict(env), {i: f["folders"] for i, f in found.items()}, settings_of(sl))

    @staticmethod
    def _let_go(sl: Slice) -> None:
        kernel = manager.MANAGER
        kernel.attached.pop(sl.name, None)
        kernel.env.pop(sl.name, None)
        if kernel.current_name == sl.name:
            kernel.current_name = None

    def give_back(self, key: Key, end_services: bool = False) -> list[str]:
        """Take the slice back from the test and reset it; what the test left behind (then the
        slice is ended, and the next test gets a new one), or nothing. ``end_services``: the test
        said its services and forwards are to be ended (tests/markers.py's ``ends_services``)."""
        warm = self.warm[key]
        sl = warm.slice
        self._let_go(sl)
        if end_services and not sl.session.closed:
            for made in sl.forwards:
                made.close()
            sl.forwards.clear()
            sl.serving.stop_all()
        problems = self._left_behind(warm)
        if problems:
            del self.warm[key]
            sl.close()
        return problems

    @staticmethod
    def _left_behind(warm: Warm) -> list[str]:
        sl = warm.slice
        if sl.session.closed or sl._gone:
            return ["it deleted or closed the shared slice"]
        dead = sl.session.dead_hosts() + sl.needs_restart
        if dead:
            return [f"host{'s' if len(dead) > 1 else ''} {sorted(set(dead))} of the shared slice died or were ended"]
        problems = []
        running = sl.session.requests.in_flight()
        if running:
            problems.append(f"{len(running)} request(s) still running or waiting (background cells?): "
                            f"{', '.join(r.kind for r in running)}")
        if sl.forwards:
            problems.append(f"{len(sl.forwards)} port forward(s) left open")
        services = sl.services()
        if services:
            problems.append(f"services left running: {', '.join(sorted({s.name for s in services}))}")
        changed = {k: v for k, v in settings_of(sl).items() if v != warm.settings[k]}
        if changed:
            problems.append(f"settings changed: {changed}")
        if problems:
            return problems
        found = sl.reset()
        environ = sorted({name for f in found.values() for name in f["environ"]})
        if environ:
            problems.append(f"the hosts' environment changed: {', '.join(environ)}")
        for index, f in found.items():
            for place, paths in f["folders"].items():
                new = sorted(set(paths) - set(warm.folders.get(index, {}).get(place, [])))
                if new:
                    problems.append(f"host {index} left files in {place}: {', '.join(new[:5])}")
        return problems

    def close(self) -> None:
        for warm in self.warm.values():
            warm.slice.close()
        self.warm.clear()
