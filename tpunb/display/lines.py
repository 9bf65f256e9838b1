"""Hosts' streams made into notebook lines: cut as a terminal shows them (``LineSplitter``),
aligned and grouped across hosts (``LineMerger``), and lines rewritten with carriage returns
updated in place (``LiveLines``)."""
from __future__ import annotations

import collections
import time
from typing import Callable


class LineMerger:
    """Aligns the hosts' lines by position and groups identical ones.

    Counters (lines queued, running hosts with none queued) keep a host's frame O(1) when there is
    nothing to emit, so a cell on N hosts costs O(N), not O(N^2), to merge."""

    def __init__(self, hosts: list[int], max_wait: float = 0.25, clock: Callable[[], float] = time.monotonic) -> None:
        self.hosts = list(hosts)
        self.max_wait = max_wait
        self.clock = clock
        self.partial = {h: "" for h in self.hosts}
        self.lines: dict[int, collections.deque] = {h: collections.deque() for h in self.hosts}
        self.done: set[int] = set()
        self.oldest: float | None = None
        self.queued = 0  # lines waiting, over every host
        self._starved = len(self.lines)  # hosts still running with no line waiting: a row cannot be complete

    def _queue(self, host: int, lines: list[str]) -> None:
        queue = self.lines[host]
        if not queue and host not in self.done:
            self._starved -= 1
        queue.extend(lines)
        self.queued += len(lines)
        if self.oldest is None:
            self.oldest = self.clock()

    def feed(self, host: int, text: str) -> list[tuple[list[int], str]]:
        pieces = (self.partial[host] + text).split("\n")
        self.partial[host] = pieces.pop()
        if pieces:
            self._queue(host, pieces)
        return self._emit(force=False)

    def feed_lines(self, host: int, lines: list[str]) -> list[tuple[list[int], str]]:
        """Like ``feed``, for text already cut into whole lines."""
        if lines:
            self._queue(host, lines)
        return self._emit(force=False)

    def host_done(self, host: int) -> list[tuple[list[int], str]]:
        if host in self.done:
            return self._emit(force=False)
        if self.partial[host]:
            self._queue(host, [self.partial[host]])
            self.partial[host] = ""
        if not self.lines[host]:
            self._starved -= 1
        self.done.add(host)
        return self._emit(force=False)

    def tick(self) -> list[tuple[list[int], str]]:
        overdue = self.oldest is not None and self.clock() - self.oldest >= self.max_wait
        return self._emit(force=overdue)

    def finish(self) -> list[tuple[list[int], str]]:
        for host in self.hosts:
            if self.partial[host]:
                self._queue(host, [self.partial[host]])
                self.partial[host] = ""
        return self._emit(force=True)

    def clear(self) -> list[tuple[int, str]]:
        """Every waiting line, (host, line), taken out unshown (the notebook's cap was reached)."""
        taken = []
        for host, lines in self.lines.items():
            if lines and host not in self.done:
                self._starved += 1
            taken.extend((host, line) for line in lines)
            lines.clear()
        self.queued, self.oldest = 0, None
        return taken

    def _emit(self, force: bool) -> list[tuple[list[int], str]]:
        out: list[tuple[list[int], str]] = []
        while self.queued and (force or not self._starved):
            groups: dict[str, list[int]] = {}
            for h in self.hosts:
                lines = self.lines[h]
                if lines:
                    groups.setdefault(lines.popleft(), []).append(h)
                    self.queued -= 1
                    if not lines and h not in self.done:
                        self._starved += 1
            out.extend((hosts, line) for line, hosts in groups.items())
        if out:  # the oldest waiting line is now younger: restart its clock
            self.oldest = self.clock() if self.queued else None
        return out


class LineSplitter:
    """One host's stream cut into lines for the notebook, as a terminal would show them.

    A line rewritten with ``\r`` (a progress bar) is one line showing its last state, and while
    it is being rewritten ``live`` is that state. A line longer than ``limit`` is cut, so a 20 MB
    line never reaches the notebook (its log has it whole); what is held is at most ``limit``.
    """

    def __init__(self, limit: int = 10_000) -> None:
        self.limit = limit
        self.text = ""  # the visible state of the line not yet ended
        self.cut = 0  # characters of it beyond ``limit``, dropped
        self.rewritten = False  # it contains a \r
        self.restart = False  # it ended with \r: the next text overwrites it

    @property
    def live(self) -> str | None:
        return self._shown() if self.rewritten and (self.text or self.cut) else None

    def feed(self, text: str) -> tuple[list[str], list[int]]:
        """The lines ``text`` ends, and the indices among them of lines rewritten with \r."""
        pieces = text.split("\n")
        rest = pieces.pop()
        if not pieces:
            self._extend(rest)
            return [], []
        rewritten: list[int] = []
        self._extend(pieces[0])
        lines = [self._end(rewritten, 0)]
        if "\r" in text or len(text) > self.limit:  # the slow path, rarely taken
            for i, piece in enumerate(pieces[1:], 1):
                self._extend(piece)
                lines.append(self._end(rewritten, i))
        else:
            lines.extend(pieces[1:])
        self._extend(rest)
        return lines, rewritten

    def end(self) -> tuple[str | None, bool]:
        """The unfinished line, ended (a host finished); (None, False) if there is none."""
        if not (self.text or self.cut):
            self.rewritten = self.restart = False
            return None, False
        was = self.rewritten
        marks: list[int] = []
        return self._end(marks, 0), was

    def _extend(self, piece: str) -> None:
        if not piece:
            return
        if "\r" in piece:
            self.rewritten = True
            stripped = piece.rstrip("\r")
            ends = len(stripped) < len(piece)
            if "\r" in stripped:
                self._set(stripped.rpartition("\r")[2])
            elif stripped:
                self._append(stripped)
            self.restart = ends
            return
        self._append(piece)

    def _append(self, piece: str) -> None:
        if self.restart:
            self.text, self.cut, self.restart = "", 0, False
        room = self.limit - len(self.text)
        if room >= len(piece):
            self.text += piece
        else:
            self.text += piece[:max(room, 0)]
            self.cut += len(piece) - max(room, 0)

    def _set(self, piece: str) -> None:
        self.text, self.cut, self.restart = piece[:self.limit], max(0, len(piece) - self.limit), False

    def _shown(self) -> str:
        return self.text + (f"… [{self.cut:,} more characters in the log]" if self.cut else "")

    def _end(self, rewritten: list[int], index: int) -> str:
        line = self._shown()
        if self.rewritten:
            rewritten.append(index)
        self.text, self.cut, self.rewritten, self.restart = "", 0, False, False
        return line


class LiveLines:
    """The lines hosts are rewriting with \r right now, one per host, shown as one output that is
    updated in place at most every ``interval`` seconds (a million \r make a few updates)."""

    def __init__(self, show: Callable[[dict, str | None], str], label: Callable[[list[int]], str],
                 interval: float = 0.1, clock: Callable[[], float] = time.monotonic) -> None:
        self.show = show
        self.label = label
        self.interval = interval
        self.clock = clock
        self.display_id: str | None = None
        self.lines: dict[int, str] = {}
        self.ended: set[int] = set()
        self.dirty = False
        self.shown_at = float("-inf")

    def _next(self, host: int) -> None:
        if host in self.ended:  # a new bar after this host's last one ended: a new output below
            self.display_id, self.lines, self.ended = None, {}, set()

    def update(self, host: int, text: str, hold: bool = False) -> None:
        """``hold``: lines printed before are still waiting; the first render waits for them."""
        self._next(host)
        if self.lines.get(host) != text:
            self.lines[host], self.dirty = text, True
        if not (hold and self.display_id is None):
            self.render(force=self.display_id is None)

    def end(self, host: int, text: str, hold: bool = False) -> None:
        self._next(host)
        self.lines[host], self.dirty = text, True
        self.ended.add(host)
        if not (hold and self.display_id is None):
            self.render(force=True)

    def render(self, force: bool = False) -> None:
        force = force or self.display_id is None
        if not self.dirty or (not force and self.clock() - self.shown_at < self.interval):
            return
        text = "\n".join(f"{self.label([h])}{line}" for h, line in sorted(self.lines.items()))
        self.display_id = self.show({"text/plain": text}, self.display_id)
        self.dirty, self.shown_at = False, self.clock()
