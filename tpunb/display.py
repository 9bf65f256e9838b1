"""Rendering per-host output for notebooks: live labelled lines, collapsed values, logs.

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

from tpunb.session import OutputSink

MODES = ("grouped", "all", "first")
DEFAULT_CAP_LINES = 2000
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def format_hosts(hosts: Iterable[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5'."""
    ordered = sorted(set(hosts))
    parts, i = [], 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


class LineMerger:
    """Aligns the hosts' lines by position and groups identical ones."""

    def __init__(self, hosts: list[int], max_wait: float = 0.25, clock: Callable[[], float] = time.monotonic) -> None:
        self.hosts = list(hosts)
        self.max_wait = max_wait
        self.clock = clock
        self.partial = {h: "" for h in self.hosts}
        self.lines: dict[int, collections.deque] = {h: collections.deque() for h in self.hosts}
        self.done: set[int] = set()
        self.oldest: float | None = None

    def feed(self, host: int, text: str) -> list[tuple[list[int], str]]:
        pieces = (self.partial[host] + text).split("\n")
        self.partial[host] = pieces.pop()
        if pieces:
            self.lines[host].extend(pieces)
            if self.oldest is None:
                self.oldest = self.clock()
        return self._emit(force=False)

    def host_done(self, host: int) -> list[tuple[list[int], str]]:
        self.done.add(host)
        if self.partial[host]:
            self.lines[host].append(self.partial[host])
            self.partial[host] = ""
            if self.oldest is None:
                self.oldest = self.clock()
        return self._emit(force=False)

    def tick(self) -> list[tuple[list[int], str]]:
        overdue = self.oldest is not None and self.clock() - self.oldest >= self.max_wait
        return self._emit(force=overdue)

    def finish(self) -> list[tuple[list[int], str]]:
        for host in self.hosts:
            if self.partial[host]:
                self.lines[host].append(self.partial[host])
                self.partial[host] = ""
        return self._emit(force=True)

    def _emit(self, force: bool) -> list[tuple[list[int], str]]:
        out: list[tuple[list[int], str]] = []
        while True:
            have = [h for h in self.hosts if self.lines[h]]
            if not have:
                break
            waiting = any(not self.lines[h] and h not in self.done for h in self.hosts)
            if waiting and not force:
                break
            groups: dict[str, list[int]] = {}
            for h in have:
                groups.setdefault(self.lines[h].popleft(), []).append(h)
            out.extend((hosts, line) for line, hosts in groups.items())
        if out:  # the oldest waiting line is now younger: restart its clock
            self.oldest = self.clock() if any(self.lines.values()) else None
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


class CellOutput(OutputSink):
    """Live rendering of one cell's output in a notebook (or any stdout/stderr)."""

    def __init__(self, hosts: list[int], num_hosts: int, mode: str = "grouped", logs: HostLogs | None = None,
                 cap_lines: int = DEFAULT_CAP_LINES, out: TextIO | None = None, err: TextIO | None = None,
                 show: Callable[[dict, dict], None] = _ipython_display, max_wait: float = 0.25) -> None:
        self.hosts = hosts
        self.labelled = num_hosts > 1
        self.mode = mode
        self.logs = logs
        self.cap_lines = cap_lines
        self.out = out
        self.err = err
        self.show = show
        self.first = min(hosts) if hosts else 0
        self.mergers = {name: LineMerger(hosts, max_wait) for name in ("stdout", "stderr")}
        self.printed = 0
        self.capped = False
        self.hidden_displays: set[int] = set()

    def _stream_file(self, name: str) -> TextIO:
        if name == "stderr":
            return self.err or sys.stderr
        return self.out or sys.stdout

    def _label(self, hosts: list[int]) -> str:
        return f"[{format_hosts(hosts)}] " if self.labelled else ""

    def _print(self, name: str, groups: list[tuple[list[int], str]]) -> None:
        if not groups or self.capped:
            return
        room = self.cap_lines - self.printed
        text = "".join(f"{self._label(hosts)}{line}\n" for hosts, line in groups[:room])
        self.printed += min(len(groups), room)
        stream = self._stream_file(name)
        stream.write(text)
        if len(groups) > room:
            self.capped = True
            where = f" in {self.logs.directory}/host-N.log" if self.logs else ""
            stream.write(f"[tpunb] output capped at {self.cap_lines} lines; the full text of every host is"
                         f"{where} and in tpunb.last_result()\n")
        stream.flush()

    def stream(self, host: int, name: str, text: str) -> None:
        if self.logs is not None:
            self.logs.write(host, text if name == "stdout" else ANSI.sub("", text))
        if self.mode == "first" and host != self.first:
            return
        if self.mode == "grouped":
            self._print(name, self.mergers[name].feed(host, text))
        else:  # every line as it comes, labelled by its own host
            pieces = (self.mergers[name].partial[host] + text).split("\n")
            self.mergers[name].partial[host] = pieces.pop()
            self._print(name, [([host], line) for line in pieces])

    def host_done(self, host: int) -> None:
        for name, merger in self.mergers.items():
            if self.mode == "grouped":
                self._print(name, merger.host_done(host))
            elif merger.partial.get(host):
                line, merger.partial[host] = merger.partial[host], ""
                if self.mode == "all" or host == self.first:
                    self._print(name, [([host], line)])

    def tick(self) -> None:
        if self.mode == "grouped":
            for name, merger in self.mergers.items():
                self._print(name, merger.tick())

    def finish(self) -> None:
        for name, merger in self.mergers.items():
            self._print(name, merger.finish() if self.mode == "grouped" else [])
        if self.logs is not None:
            self.logs.flush()
        if self.hidden_displays:
            hosts = format_hosts(self.hidden_displays)
            self._stream_file("stdout").write(f"[tpunb] rich output from hosts {hosts} not shown; "
                                              "use --output all to see every host's\n")

    def display(self, host: int, data: dict, metadata: dict) -> None:
        if self.mode != "all" and host != self.first:
            self.hidden_displays.add(host)
            return
        for name in ("stdout", "stderr"):  # text printed before the display comes first
            self._print(name, self.mergers[name].finish() if self.mode == "grouped" else [])
        if self.mode == "all" and self.labelled:
            self.show({"text/plain": f"[{host}]"}, {})
        self.show(data, metadata)


def render_values(results: dict, mode: str, num_hosts: int,
                  show: Callable[[dict, dict], None] = _ipython_display) -> None:
    """Show each host's last-expression value; identical values once, rich ones from host 0."""
    valued = {h: r.value for h, r in sorted(results.items()) if r.value}
    if not valued:
        return
    labelled = num_hosts > 1
    first = min(results)
    if mode == "all":
        for host, bundle in valued.items():
            _show_value([host], bundle, labelled, show)
        return
    if mode == "first":
        valued = {h: b for h, b in valued.items() if h == first}
    groups: dict[str, list[int]] = {}
    for host, bundle in valued.items():
        groups.setdefault(bundle.get("text/plain", ""), []).append(host)
    for text, hosts in groups.items():
        bundle = valued[first] if first in hosts else valued[hosts[0]]
        rich = first in hosts and any(k != "text/plain" for k in bundle)
        _show_value(hosts, bundle if rich else {"text/plain": text}, labelled, show)


def _show_value(hosts: list[int], bundle: dict, labelled: bool, show: Callable[[dict, dict], None]) -> None:
    if not labelled:
        show(bundle, {})
        return
    label = f"Out[{format_hosts(hosts)}]:"
    if set(bundle) == {"text/plain"}:
        text = bundle["text/plain"]
        show({"text/plain": f"{label}\n{text}" if "\n" in text else f"{label} {text}"}, {})
    else:
        show({"text/plain": label}, {})
        show(bundle, {})
