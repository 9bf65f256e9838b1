"""A cell's per-host output in the notebook, live, labelled and capped, and in full in the logs.

SPMD programs print the same thing on every host, so by default (``grouped``) the i-th line of
every host is compared and printed once, labelled with the hosts that printed it ("[0-3] loss
1.25"). A line that some hosts have not printed yet waits a moment (``max_wait``), never longer,
so output stays live. Everything is also appended to per-host log files, which are where the
full text lives once the notebook's copy is capped.
"""
from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path
from typing import Callable, Iterable, TextIO

from tpunb.display.hosts import HostNames, format_hosts
from tpunb.display.kernel import ipython_display, ipython_live
from tpunb.display.lines import LineMerger, LineSplitter, LiveLines
from tpunb.display.progress import HostsProgress
from tpunb.display.sink import OutputSink
from tpunb.units import format_bytes

MODES = ("grouped", "all", "first")
DEFAULT_CAP_LINES = 2000
DEFAULT_CAP_BYTES = 1 << 20  # 1 MiB, said as such in the cap notice
#: the longest line shown in the notebook; the log has it whole
LINE_CHARS = 10_000
#: rich output (displays) of one cell shown in the notebook, in characters of its data
DISPLAY_CHARS = 50 << 20
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


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


def _size(text: str) -> int:
    """Bytes of ``text`` as UTF-8, without encoding it when it is ASCII."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "replace"))


def group_wait() -> float:
    """How long a line waits for hosts that have not printed it: 0.25 s, or $TPUNB_GROUP_WAIT, which
    the notebook checks set so a loaded machine groups lines as the stored outputs do."""
    return float(os.environ.get("TPUNB_GROUP_WAIT") or 0.25)


class CellOutput(OutputSink):
    """Live rendering of one cell's output in a notebook (or any stdout/stderr).

    The notebook gets a capped view: at most ``cap_lines`` lines and ``cap_bytes`` bytes of a
    cell's output in all, ``host_cap_lines``/``host_cap_bytes`` of any one host, ``line_chars``
    characters of a line; then one notice, and from there output is only counted (the per-host
    logs get everything). Lines rewritten with \r are one line each, shown updating in place.
    """

    def __init__(self, hosts: list[int], num_hosts: int, mode: str = "grouped", logs: HostLogs | None = None,
                 cap_lines: int = DEFAULT_CAP_LINES, out: TextIO | None = None, err: TextIO | None = None,
                 show: Callable[[dict, dict], None] = ipython_display, max_wait: float | None = None,
                 cap_bytes: int = DEFAULT_CAP_BYTES, host_cap_lines: int | None = None,
                 host_cap_bytes: int | None = None, line_chars: int = LINE_CHARS,
                 live: Callable[[dict, str | None], str] = ipython_live, live_interval: float = 0.1,
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
        max_wait = group_wait() if max_wait is None else max_wait
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
        stream.write(f"[tpunb] output capped at {self.cap_lines:,} lines / {format_bytes(self.cap_bytes)} per cell here; "
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
            per_host = ", ".join(f"host {self.names([h])}: {n:,} ({format_bytes(self.hidden_bytes[h])})"
                                 for h, n in sorted(hidden.items()))
            out.write(f"[tpunb] {total:,} lines not shown here ({per_host}); full output in {self._where()}, "
                      "the last 1 MiB in tpunb.last_result()[N].stdout\n")
        if self.capped_displays:
            out.write(f"[tpunb] {self.capped_displays} rich outputs not shown: over {format_bytes(DISPLAY_CHARS)} "
                      "of rich output in this cell\n")
        if self.hidden_displays:
            hosts = self.names(self.hidden_displays)
            out.write(f"[tpunb] rich output from hosts {hosts} not shown; use --output all to see every host's\n")

    def laggards(self, where: dict[int, str]) -> None:
        if self.progress is not None:
            self.progress.laggards(where)

    def note(self, text: str) -> None:
        self._flush_lines()  # after what the hosts printed before it
        self._emit("stdout", [text if text.endswith("\n") else text + "\n"])

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


#: lines printed between cells (background threads) shown before the next cell; the log has all
BACKLOG_LINES = 200


def show_between_cells(backlog, logs: HostLogs, name: Callable[[int], str]) -> None:
    """Output hosts wrote between cells (their background threads; a queue of (host, frame, blob)):
    shown, labelled, before the next cell; the logs get all of it."""
    shown, hidden = 0, 0
    while not backlog.empty():
        host, message, _ = backlog.get_nowait()
        if message.get("op") == "stream":
            logs.write(host, message["text"])
            stream = sys.stderr if message.get("name") == "stderr" else sys.stdout
            lines = message["text"].splitlines()
            room = max(0, BACKLOG_LINES - shown)
            stream.write("".join(f"[{name(host)}, between cells] {line[:LINE_CHARS]}\n" for line in lines[:room]))
            shown, hidden = shown + min(room, len(lines)), hidden + max(0, len(lines) - room)
    if hidden:
        sys.stdout.write(f"[tpunb] {hidden:,} more lines printed between cells are in {logs.directory}/host-N.log\n")
