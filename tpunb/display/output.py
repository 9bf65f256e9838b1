"""Per-host output for notebooks: live labelled lines, collapsed values, logs.

SPMD programs print the same thing on every host, so by default (``grouped``) the i-th line of
every host is compared and printed once, labelled with the hosts that printed it ("[0-3] loss
1.25"). A line that some hosts have not printed yet waits a moment (``max_wait``), never longer,
so output stays live. Everything is also appended to per-host log files, which are where the
full text lives once the notebook's copy is capped.
"""
from __future__ import annotations

import collections
import re
import sys
import time
from pathlib import Path
from typing import Callable, Iterable, TextIO

from tpunb.display.hosts import HostNames, format_hosts
from tpunb.display.sink import OutputSink

MODES = ("grouped", "all", "first")
DEFAULT_CAP_LINES = 2000
DEFAULT_CAP_BYTES = 1_000_000
#: the longest line shown in the notebook; the log has it whole
LINE_CHARS = 10_000
#: rich output (displays) of one cell shown in the notebook, in characters of its data
DISPLAY_CHARS = 50_000_000
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


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


class HostLogs:
    """Append-only log file per host under $TPUNB_HOME/logs/<slice>/: the full, uncapped text."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._files: dict[int, TextIO] = {}
        self._header = ""
        self._header_due: set[int] = set()

    def path(self, host: int) -> Path:
        return self.directory / f"host-{host}.log"

    def write(self, host: int, text: str) -> None:
        f = self._files.get(host)
        if f is None:
            f = self._files[host] = open(self.path(host), "a", encoding="utf-8")
        if host in self._header_due:  # a cell's header only above output it actually produced
            self._header_due.discard(host)
            f.write(self._header)
        f.write(text)

    def begin_cell(self, hosts: Iterable[int], code: str) -> None:
        first = code.strip().splitlines()[0][:80] if code.strip() else ""
        self._header = f"\n--- cell at {time.strftime('%Y-%m-%d %H:%M:%S')}: {first}\n"
        self._header_due = set(hosts)

    def flush(self) -> None:
        for f in self._files.values():
            f.flush()

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()


def kernel_colors() -> str | None:
    """The kernel's traceback colour scheme, for hosts to use too (ipykernel's Neutral reads on
    light and dark themes, where a terminal's Linux scheme turns grey on JupyterLab's pink)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    shell = get_ipython()
    return str(getattr(shell, "colors", None) or "Neutral")


def kernel_cell_number() -> int | None:
    """The number of the notebook cell running now, so a host's traceback says ``Cell In[5]``
    for the cell the user sees as [5]; None outside IPython."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    shell = get_ipython()
    return getattr(shell, "execution_count", None) if shell is not None else None


def _ipython_display(data: dict, metadata: dict | None = None) -> None:
    from IPython.display import display

    display(data, raw=True, metadata=metadata or None)


def _ipython_live(data: dict, display_id: str | None) -> str:
    """Show ``data`` as a new output (``display_id`` None) or update that output in place."""
    from IPython.display import display, update_display

    if display_id is None:
        return display(data, raw=True, display_id=True).display_id
    update_display(data, raw=True, display_id=display_id)
    return display_id


def _size(text: str) -> int:
    """Bytes of ``text`` as UTF-8, without encoding it when it is ASCII."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "replace"))


def _megabytes(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 100_000 else f"{n / 1e3:.1f} kB" if n >= 1000 else f"{n} bytes"


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


class CellOutput(OutputSink):
    """Live rendering of one cell's output in a notebook (or any stdout/stderr).

    The notebook gets a capped view: at most ``cap_lines`` lines and ``cap_bytes`` bytes of a
    cell's output in all, ``host_cap_lines``/``host_cap_bytes`` of any one host, ``line_chars``
    characters of a line; then one notice, and from there output is only counted (the per-host
    logs get everything). Lines rewritten with \r are one line each, shown updating in place.
    """

    def __init__(self, hosts: list[int], num_hosts: int, mode: str = "grouped", logs: HostLogs | None = None,
                 cap_lines: int = DEFAULT_CAP_LINES, out: TextIO | None = None, err: TextIO | None = None,
                 show: Callable[[dict, dict], None] = _ipython_display, max_wait: float = 0.25,
                 cap_bytes: int = DEFAULT_CAP_BYTES, host_cap_lines: int | None = None,
                 host_cap_bytes: int | None = None, line_chars: int = LINE_CHARS,
                 live: Callable[[dict, str | None], str] = _ipython_live, live_interval: float = 0.1,
                 clock: Callable[[], float] = time.monotonic, names: HostNames = format_hosts) -> None:
        self.hosts = hosts
        self.names = names
        self.labelled = num_hosts > 1
        self.mode = mode
        self.logs = logs
        self.cap_lines, self.cap_bytes = cap_lines, cap_bytes
        self.host_cap_lines = cap_lines if host_cap_lines is None else host_cap_lines
        self.host_cap_bytes = cap_bytes if host_cap_bytes is None else host_cap_bytes
        self.out = out
        self.err = err
        self.show = show
        self.first = min(hosts) if hosts else 0
        self.viewed = set(hosts) if mode != "first" else {self.first}
        self.line_chars = line_chars
        #: (stream, host) -> its unfinished line; made at a host's first output (most cells print nothing)
        self.splitters: dict[tuple[str, int], LineSplitter] = {}
        self.mergers = {name: LineMerger(hosts, max_wait) for name in ("stdout", "stderr")}
        self.bars = {name: LiveLines(live, self._label, live_interval, clock) for name in ("stdout", "stderr")}
        self.printed = self.printed_bytes = 0
        self.host_lines = dict.fromkeys(hosts, 0)
        self.host_bytes = dict.fromkeys(hosts, 0)
        self.hidden_lines = dict.fromkeys(hosts, 0)
        self.hidden_bytes = dict.fromkeys(hosts, 0)
        self.open_line: dict[int, bool] = {}  # hidden output of a host ends inside a line
        self.full: set[int] = set()  # hosts past their own cap
        self.capped = False
        self.hidden_displays: set[int] = set()
        self.display_chars = 0
        self.capped_displays = 0
        self.progress = HostsProgress(hosts, out=self._stream_file("stdout"), names=names) if len(hosts) > 1 else None

    def _stream_file(self, name: str) -> TextIO:
        if name == "stderr":
            return self.err or sys.stderr
        return self.out or sys.stdout

    def _label(self, hosts: list[int]) -> str:
        return f"[{self.names(hosts)}] " if self.labelled else ""

    # -- counting what the notebook does not show ---------------------------------------------
    def _hide(self, host: int, text: str) -> None:
        if text:
            self.hidden_lines[host] += text.count("\n")
            self.hidden_bytes[host] += _size(text)
            self.open_line[host] = not text.endswith("\n")

    def _hide_line(self, hosts: list[int], line: str) -> None:
        for h in hosts:
            self.hidden_lines[h] += 1
            self.hidden_bytes[h] += _size(line) + 1

    def _cap(self, name: str) -> None:
        """The notebook's share is used up: say so once; what is still held is counted, not shown."""
        if self.capped:
            return
        self.capped = True
        for (_, host), splitter in self.splitters.items():
            line, _ = splitter.end()
            if line is not None:
                self._hide(host, line)
        for merger in self.mergers.values():
            for host, line in merger.clear():
                self._hide_line([host], line)
        stream = self._stream_file(name)
        stream.write(f"[tpunb] output capped at {self.cap_lines:,} lines / {_megabytes(self.cap_bytes)} per cell here; "
                     f"the rest is counted at the end and written in full to {self._where()}\n")
        stream.flush()

    def _where(self) -> str:
        return f"{self.logs.directory}/host-N.log" if self.logs else "the hosts' logs"

    # -- the notebook's view --------------------------------------------------------------------
    def _print(self, name: str, groups: list[tuple[list[int], str]]) -> None:
        if not groups:
            return
        if self.capped:
            for hosts, line in groups:
                self._hide_line(hosts, line)
            return
        parts = []
        for i, (hosts, line) in enumerate(groups):
            size = _size(line) + 1
            if self.printed >= self.cap_lines or self.printed_bytes + size > self.cap_bytes:
                self._emit(name, parts)
                self._cap(name)
                for rest_hosts, rest in groups[i:]:
                    self._hide_line(rest_hosts, rest)
                return
            shown = [h for h in hosts if not self._host_over(h, size)]
            if len(shown) < len(hosts):
                self._hide_line([h for h in hosts if h not in shown], line)
            if not shown:
                continue
            parts.append(f"{self._label(shown)}{line}\n")
            self.printed += 1
            self.printed_bytes += size
            for h in shown:
                self.host_lines[h] += 1
                self.host_bytes[h] += size
        self._emit(name, parts)

    def _host_over(self, host: int, size: int) -> bool:
        if host in self.full:
            return True
        if self.host_lines[host] >= self.host_cap_lines or self.host_bytes[host] + size > self.host_cap_bytes:
            self.full.add(host)
            for name in ("stdout", "stderr"):  # from now on this host's output is only counted
                splitter = self.splitters.pop((name, host), None)
                if splitter is not None and splitter.text:
                    self.hidden_bytes[host] += _size(splitter.text)
                    self.open_line[host] = True
            return True
        return False

    def _emit(self, name: str, parts: list[str]) -> None:
        if parts:
            stream = self._stream_file(name)
            stream.write("".join(parts))
            stream.flush()

    def stream(self, host: int, name: str, text: str) -> None:
        if self.logs is not None:
            self.logs.write(host, text if name == "stdout" else ANSI.sub("", text))
        if host not in self.viewed:
            return
        if self.capped or host in self.full:
            self._hide(host, text)
            return
        splitter = self.splitters.get((name, host))
        if splitter is None:
            splitter = self.splitters[(name, host)] = LineSplitter(self.line_chars)
        lines, rewritten = splitter.feed(text)
        if rewritten:
            bars = self.bars[name]
            for i in reversed(rewritten):  # a finished bar stays in its output, counted as one line
                line = lines.pop(i)
                if self._take_line(host, line):
                    self._bar(name, host, line, ended=True)
        room = self.cap_lines - self.printed + 1
        if len(lines) > room:  # these can never be shown: only count them
            for line in lines[room:]:
                self._hide_line([host], line)
            del lines[room:]
        if self.mode == "grouped":
            self._print(name, self.mergers[name].feed_lines(host, lines))
        else:
            self._print(name, [([host], line) for line in lines])
        live = splitter.live
        if live is not None and not self.capped:
            self._bar(name, host, live, ended=False)
        elif self.bars[name].dirty and not self._pending():  # a bar held back for earlier lines
            self.bars[name].render()

    def _bar(self, name: str, host: int, text: str, ended: bool) -> None:
        # lines printed before a bar stay above it: a new bar's output waits until they are out
        (self.bars[name].end if ended else self.bars[name].update)(host, text, hold=self._pending())

    def _pending(self) -> bool:
        return self.mode == "grouped" and any(m.queued for m in self.mergers.values())

    def _take_line(self, host: int, line: str) -> bool:
        """Count one line shown outside the stream (a finished bar); False once over a cap."""
        size = _size(line) + 1
        if self.capped or self._host_over(host, size) or self.printed >= self.cap_lines \
                or self.printed_bytes + size > self.cap_bytes:
            self._hide_line([host], line)
            return False
        self.printed += 1
        self.printed_bytes += size
        self.host_lines[host] += 1
        self.host_bytes[host] += size
        return True

    def _flush_lines(self) -> None:
        for name, merger in self.mergers.items():
            self._print(name, merger.finish() if self.mode == "grouped" else [])

    def _end_partial(self, name: str, host: int) -> None:
        """A host's unfinished line, ended: it finished, or something comes after it."""
        splitter = self.splitters.get((name, host))
        if splitter is None or self.capped or host in self.full:
            return
        line, was_bar = splitter.end()
        if line is None:
            return
        if was_bar:
            if self._take_line(host, line):
                self._bar(name, host, line, ended=True)
        elif self.mode == "grouped":
            self._print(name, self.mergers[name].feed_lines(host, [line]))
        else:
            self._print(name, [([host], line)])

    def host_done(self, host: int) -> None:
        if self.progress is not None:
            self.progress.host_done(host)
        for name, merger in self.mergers.items():
            self._end_partial(name, host)
            if self.mode == "grouped":
                self._print(name, merger.host_done(host))
        if self.open_line.pop(host, False):
            self.hidden_lines[host] += 1

    def tick(self) -> None:
        if self.mode == "grouped":
            for name, merger in self.mergers.items():
                self._print(name, merger.tick())
        if self.progress is not None:
            self.progress.tick()
        if not self._pending():
            for bars in self.bars.values():
                bars.render()

    def finish(self) -> None:
        if self.progress is not None:
            self.progress.finish()
        for host in self.viewed:
            if self.open_line.pop(host, False):
                self.hidden_lines[host] += 1
        for name in self.mergers:
            for host in sorted(self.viewed):
                self._end_partial(name, host)
        self._flush_lines()
        for bars in self.bars.values():
            bars.render(force=True)
        if self.logs is not None:
            self.logs.flush()
        out = self._stream_file("stdout")
        hidden = {h: n for h, n in self.hidden_lines.items() if n or self.hidden_bytes[h]}
        if hidden:
            total = sum(hidden.values())
            per_host = ", ".join(f"host {self.names([h])}: {n:,} ({_megabytes(self.hidden_bytes[h])})"
                                 for h, n in sorted(hidden.items()))
            out.write(f"[tpunb] {total:,} lines not shown here ({per_host}); full output in {self._where()}, "
                      "the last 1 MB in tpunb.last_result()[N].stdout\n")
        if self.capped_displays:
            out.write(f"[tpunb] {self.capped_displays} rich outputs not shown: over {_megabytes(DISPLAY_CHARS)} "
                      "of rich output in this cell\n")
        if self.hidden_displays:
            hosts = self.names(self.hidden_displays)
            out.write(f"[tpunb] rich output from hosts {hosts} not shown; use --output all to see every host's\n")

    def display(self, host: int, data: dict, metadata: dict) -> None:
        if self.mode != "all" and host != self.first:
            self.hidden_displays.add(host)
            return
        size = sum(len(v) if isinstance(v, str) else len(str(v)) for v in data.values())
        if self.display_chars + size > DISPLAY_CHARS:
            self.capped_displays += 1
            return
        self.display_chars += size
        for name in self.mergers:  # text printed before the display comes first
            self._end_partial(name, host)
        self._flush_lines()
        if self.mode == "all" and self.labelled:
            self.show({"text/plain": f"[{self.names([host])}]"}, {})
        self.show(data, metadata)


class HostsProgress:
    """While a cell runs on several hosts, once some are done and others run on (stragglers), one
    status line: ``hosts 0-2 done (1.1-1.3 s) · host 3 running 12.4 s``.

    It appears only after the first host has been done for ``after`` seconds, so fast cells cost
    nothing. In a notebook it updates in place (a display handle); elsewhere (terminal IPython,
    plain Python) it is a plain line, printed when a host finishes and every ``every`` seconds.
    ``publish(text, final)`` replaces both (tests).
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

    def host_done(self, host: int) -> None:
        self.done.setdefault(host, self.clock() - self.started)

    def text(self, now: float) -> str:
        done, running = sorted(self.done), [h for h in self.hosts if h not in self.done]
        low, high = min(self.done.values()), max(self.done.values())
        took = f"{low:.1f} s" if f"{low:.1f}" == f"{high:.1f}" else f"{low:.1f}-{high:.1f} s"
        line = f"host{'s' if len(done) > 1 else ''} {self.names(done)} done ({took})"
        if running:
            line += f" · host{'s' if len(running) > 1 else ''} {self.names(running)} running {now - self.started:.1f} s"
        return line

    def tick(self) -> None:
        if not self.done:
            return
        now = self.clock()
        if now - self.started - min(self.done.values()) < self.after:
            return
        if self._shown_at is None or self._due(now):
            self._show(self.text(now), final=False)
            self._shown_at, self._shown_done = now, len(self.done)

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


def render_values(results: dict, mode: str, num_hosts: int,
                  show: Callable[[dict, dict], None] = _ipython_display, names: HostNames = format_hosts) -> None:
    """Show each host's last-expression value; identical values once, rich ones from host 0."""
    valued = {h: r.value for h, r in sorted(results.items()) if r.value}
    if not valued:
        return
    labelled = num_hosts > 1
    first = min(results)
    if mode == "all":
        for host, bundle in valued.items():
            _show_value([host], bundle, labelled, show, names)
        return
    if mode == "first":
        valued = {h: b for h, b in valued.items() if h == first}
    groups: dict[str, list[int]] = {}
    for host, bundle in valued.items():
        groups.setdefault(bundle.get("text/plain", ""), []).append(host)
    for text, hosts in groups.items():
        bundle = valued[first] if first in hosts else valued[hosts[0]]
        rich = first in hosts and any(k != "text/plain" for k in bundle)
        _show_value(hosts, bundle if rich else {"text/plain": text}, labelled, show, names)


def _show_value(hosts: list[int], bundle: dict, labelled: bool, show: Callable[[dict, dict], None],
                names: HostNames) -> None:
    if not labelled:
        show(bundle, {})
        return
    label = f"Out[{names(hosts)}]:"
    if set(bundle) == {"text/plain"}:
        text = bundle["text/plain"]
        show({"text/plain": f"{label}\n{text}" if "\n" in text else f"{label} {text}"}, {})
    else:
        show({"text/plain": label}, {})
        show(bundle, {})
