"""Every host's stacks as one record, and as text grouped by identical stacks with host ranges.

SPMD programs run the same code everywhere, so most hosts share a stack: it is printed once,
labelled with its hosts (``[0-6]``), and the odd host out stands alone (``[7]``). Each group's
first line says where its hosts are (the user's frames, then the library call they wait in);
the frames follow, user frames first (a stack is printed outermost first).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Iterator

from tpunb.display.hosts import HostNames, format_hosts
from tpunb.stuck.stack_frames import Frame, ThreadStack, parse_faulthandler, parse_pyspy

#: library frames in a row shown before and after the ones left out
LIBRARY_HEAD, LIBRARY_TAIL = 3, 2


@dataclass
class HostStacks:
    """One host's threads (main thread first), or why there are none (``error``, ``state``:
    gone, stopped, silent, unreachable). ``native_error``: why --native gave no native frames."""

    host: int
    threads: list[ThreadStack] = field(default_factory=list)
    error: str = ""
    state: str = "ok"
    native_error: str = ""

    @property
    def main(self) -> ThreadStack | None:
        return next((t for t in self.threads if t.main), None)

    @property
    def where(self) -> str:
        """Where the main thread is, in one line (or why it is not known)."""
        if self.error:
            return self.error
        return self.main.where if self.main else "no main thread found"

    @property
    def short(self) -> str:
        """Where the main thread is, shortest: its innermost user frame and the call it is in."""
        if self.error:
            return self.error
        return self.main.short if self.main else "no main thread found"


def from_reply(host: int, reply: dict, main_ident: int | None) -> HostStacks:
    """A host's reader reply -> HostStacks: py-spy's stacks where --native got them, else faulthandler's."""
    if "text" not in reply:
        return HostStacks(host, error=reply.get("error") or "no answer", state=reply.get("state") or "unreachable")
    native = reply.get("native") or {}
    if native.get("threads"):
        return HostStacks(host, parse_pyspy(native["threads"], main_ident))
    return HostStacks(host, parse_faulthandler(reply["text"], main_ident), native_error=native.get("error", ""))


class Stacks(Mapping):
    """host -> HostStacks of one slice at one moment; ``str()`` is the grouped text %tpu_stacks prints."""

    def __init__(self, slice_name: str, hosts: dict[int, HostStacks], seconds: float,
                 names: HostNames = format_hosts) -> None:
        self.slice_name = slice_name
        self._hosts = dict(sorted(hosts.items()))
        self.seconds = seconds
        self.names = names

    def __getitem__(self, host: int) -> HostStacks:
        return self._hosts[host]

    def __iter__(self) -> Iterator[int]:
        return iter(self._hosts)

    def __len__(self) -> int:
        return len(self._hosts)

    def where(self) -> dict[int, str]:
        """{host: where its main thread is, in one line}."""
        return {h: s.where for h, s in self._hosts.items()}

    def groups(self) -> list[tuple[list[int], ThreadStack]]:
        """(hosts, thread) for each distinct stack: main threads first, then the others, each in
        order of their first host."""
        found: dict[tuple, tuple[list[int], ThreadStack]] = {}
        for host, stacks in self._hosts.items():
            for thread in stacks.threads:
                found.setdefault(thread.key, ([], thread))[0].append(host)
        return sorted(found.values(), key=lambda g: (not g[1].main, g[0][0]))

    def failures(self) -> list[tuple[list[int], str]]:
        """(hosts, why) for hosts whose stacks could not be read, hosts with the same reason together."""
        by_reason: dict[str, list[int]] = {}
        for host, stacks in self._hosts.items():
            if stacks.error:
                by_reason.setdefault(stacks.error, []).append(host)
        return [(hosts, why) for why, hosts in by_reason.items()]

    def text(self, frames: bool = True, header: bool = True) -> str:
        """The grouped view; ``frames=False``: one line per group."""
        count = len(self._hosts)
        lines = [f"[tpunb] stacks of {self.slice_name!r} ({count} host{'s' if count != 1 else ''}, read in "
                 f"{self.seconds * 1000:.0f} ms)"] if header else []
        for hosts, thread in self.groups():
            label = f"[{self.names(hosts)}]"
            lines.append(f"{label} {thread.title}: {thread.where}")
            if frames and thread.frames:
                lines.extend(f"{' ' * (len(label) + 3)}{row}" for row in _frame_rows(thread.frames))
        for hosts, why in self.failures():
            lines.append(f"[{self.names(hosts)}] {why}")
        native: dict[str, list[int]] = {}
        for host, stacks in self._hosts.items():
            if stacks.native_error:
                native.setdefault(stacks.native_error, []).append(host)
        for why, hosts in native.items():
            lines.append(f"[tpunb] no native frames from host{'s' if len(hosts) > 1 else ''} {self.names(hosts)}: {why}; "
                         "the Python stacks above are complete")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text()

    def __repr__(self) -> str:
        return self.text()

    def _repr_pretty_(self, printer, cycle: bool) -> None:
        printer.text(self.text())


def _frame_rows(frames: tuple[Frame, ...]) -> list[str]:
    """A stack outermost first, one frame a line; a long run of library (and native) frames is
    cut to its first and last few, with how many were left out."""
    rows: list[str] = []
    run: list[Frame] = []

    def flush() -> None:
        if len(run) > LIBRARY_HEAD + LIBRARY_TAIL + 1:
            rows.extend(_row(f) for f in run[:LIBRARY_HEAD])
            rows.append(f"... {len(run) - LIBRARY_HEAD - LIBRARY_TAIL} more library frames")
            rows.extend(_row(f) for f in run[-LIBRARY_TAIL:])
        else:
            rows.extend(_row(f) for f in run)
        run.clear()

    for frame in frames:
        if frame.kind == "user":
            flush()
            rows.append(_row(frame))
        else:
            run.append(frame)
    flush()
    return rows


def _row(frame: Frame) -> str:
    if frame.kind == "native":
        return f"(native) {frame.function}" + (f" in {frame.place}" if frame.place else "")
    return f"{frame.place} in {frame.function}"
