"""One status line while a cell's stragglers run on after the other hosts are done, and where
each one is once they lag far behind (``laggards``)."""
from __future__ import annotations

import sys
import time
from typing import Callable, TextIO

from tpunb.display.hosts import HostNames, format_hosts


class HostsProgress:
    """While a cell runs on several hosts, once some are done and others run on (stragglers), one
    status line: ``hosts 0-2 done (1.1-1.3 s) · host 3 running 12.4 s``.

    It appears only after the first host has been done for ``after`` seconds, so fast cells cost
    nothing. In a notebook it updates in place (a display handle); elsewhere (terminal IPython,
    plain Python) it is a plain line, printed when a host finishes and every ``every`` seconds.
    ``publish(text, final)`` replaces both (tests). Once the cell's request knows where laggards
    are (``laggards``), the line says it: ``· host 3 running 31.0 s, at train.py:42 step -> psum``
    (several: ``(3,5 at X; 4 at Y)``); a plain line says each place once.
    """

    def __init__(self, hosts: list[int], after: float = 1.0, every: float = 10.0, out: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 publish: Callable[[str, bool], None] | None = None, names: HostNames = format_hosts) -> None:
        self.hosts = list(hosts)
        self.names = names
        self.after, self.every = after, every
        self.out = out
        self.clock = clock
        self.started = clock()
        self.done: dict[int, float] = {}  # host -> seconds it took
        self.publish = publish
        self._shown_at: float | None = None
        self._shown_done = 0
        self._handle = None
        self.where: dict[int, str] = {}  # laggard -> where it is (its stack, in one line)
        self._said_where: dict[int, str] = {}

    def host_done(self, host: int) -> None:
        self.done.setdefault(host, self.clock() - self.started)

    def laggards(self, where: dict[int, str]) -> None:
        """Where the hosts still running are (host -> one line), shown from the next redraw on."""
        self.where = dict(where)
        self._shown_at = None if self._shown_at is None else self._shown_at - self.every  # at the next tick

    def text(self, now: float, where: bool = True) -> str:
        done, running = sorted(self.done), [h for h in self.hosts if h not in self.done]
        low, high = min(self.done.values()), max(self.done.values())
        took = f"{low:.1f} s" if f"{low:.1f}" == f"{high:.1f}" else f"{low:.1f}-{high:.1f} s"
        line = f"host{'s' if len(done) > 1 else ''} {self.names(done)} done ({took})"
        if running:
            line += f" · host{'s' if len(running) > 1 else ''} {self.names(running)} running {now - self.started:.1f} s"
            places = {h: self.where[h] for h in running if h in self.where} if where else {}
            if places:
                line += _places(places, self.names, len(running) > 1)
        return line

    def tick(self) -> None:
        if not self.done:
            return
        now = self.clock()
        if now - self.started - min(self.done.values()) < self.after:
            return
        if self._shown_at is None or self._due(now):
            plain = self.publish is None and not self._in_notebook()
            fresh = plain and self.where != self._said_where  # a plain line says each place once
            self._show(self.text(now, where=not plain or fresh), final=False)
            self._shown_at, self._shown_done = now, len(self.done)
            if plain:
                self._said_where = dict(self.where)

    def _due(self, now: float) -> bool:
        if self.publish is None and self._in_notebook():
            return now - self._shown_at >= 0.5  # in place: a steady clock, without flooding the front end
        return len(self.done) != self._shown_done or now - self._shown_at >= self.every

    def finish(self) -> None:
        if self._shown_at is not None and self.done:
            self._show(self.text(self.clock()), final=True)

    def _show(self, text: str, final: bool) -> None:
        if self.publish is not None:
            self.publish(text, final)
        elif self._in_notebook():
            from IPython.display import display

            bundle = {"text/plain": f"[tpunb] {text}"}
            if self._handle is None:
                self._handle = display(bundle, raw=True, display_id=True)
            else:
                self._handle.update(bundle, raw=True)
        elif not final:
            out = self.out or sys.stdout
            out.write(f"[tpunb] {text}\n")
            out.flush()

    @staticmethod
    def _in_notebook() -> bool:
        """A Jupyter kernel, whose front end can update a display in place."""
        try:
            from IPython import get_ipython
        except ImportError:
            return False
        return getattr(get_ipython(), "kernel", None) is not None


def _places(places: dict[int, str], names: HostNames, several: bool) -> str:
    """Where laggards are: ``, at X`` for one; `` (3,5 at X; 4 at Y)`` for several."""
    if not several:
        return ", at " + next(iter(places.values()))
    by_place: dict[str, list[int]] = {}
    for host, place in sorted(places.items()):
        by_place.setdefault(place, []).append(host)
    return " (" + "; ".join(f"{names(hosts)} at {place}" for place, hosts in by_place.items()) + ")"
