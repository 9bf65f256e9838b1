"""One snapshot step on the hosts: a cell that calls ``tpunb_host.snapshot.entry``, its answer read
from the marker line each host prints (nothing is shown, nothing is left in the namespace).

Running the step as a cell keeps everything a cell has: Ctrl-C interrupts every host (and
escalates), a host that dies fails the step naming it, output reaches the hosts' logs.
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, Callable

from tpunb.display.sink import OutputSink
from tpunb.errors import CellInterrupted, HostDiedError, SnapshotError
from tpunb.host.snapshot import PROGRESS, REPLY

if TYPE_CHECKING:
    from tpunb.slice import Slice

#: seconds between two progress lines from host 0 while arrays are written
PROGRESS_EVERY = 0.25


class _Replies(OutputSink):
    """Reads each host's marker lines; everything else goes to the hosts' logs."""

    def __init__(self, logs, progress: Callable[[int, dict], None] | None) -> None:
        self.logs, self.progress = logs, progress
        self.replies: dict[int, dict] = {}
        self._partial: dict[int, str] = {}

    def stream(self, host: int, name: str, text: str) -> None:
        self.logs.write(host, text)
        if name != "stdout":
            return
        text = self._partial.pop(host, "") + text
        lines = text.split("\n")
        if lines[-1]:
            self._partial[host] = lines[-1]
        for line in lines[:-1]:
            if line.startswith(REPLY):
                self.replies[host] = json.loads(line[len(REPLY):])
            elif line.startswith(PROGRESS) and self.progress is not None:
                self.progress(host, json.loads(line[len(PROGRESS):]))

    def finish(self) -> None:
        self.logs.flush()


def call(sl: "Slice", op: str, args: dict, hosts: list[int] | None = None, per_host: dict | None = None,
         progress: Callable[[int, dict], None] | None = None, timeout: float | None = None,
         refusals: bool = False) -> dict[int, dict]:
    """Run step ``op`` on ``hosts`` (default all) with ``args`` plus ``host`` (and ``per_host[host]``);
    {host: reply}. A host that fails (died, interrupted, or an error in the step) raises, in one
    line; ``refusals``: replies that are not ok come back for the caller to word instead."""
    indices = list(range(sl.num_hosts)) if hosts is None else hosts
    if indices == [0] and sl.num_hosts > 1:  # a step of host 0's: the others answer at once (a cell on
        args, indices = {**args, "only": 0}, list(range(sl.num_hosts))  # some hosts warns of JAX collectives)
    sink = _Replies(sl.cell_logs, progress)
    code = _code(op, args, indices, per_host or {})
    try:
        result = sl.run(code, hosts=indices, timeout=timeout, output=None, sink=sink)
    except CellInterrupted as exc:
        raise CellInterrupted(f"interrupted during {op}: {exc}", exc.results) from None
    failed = {i: r for i, r in result.items() if r.status != "ok" or i not in sink.replies}
    if failed:
        said = "; ".join(f"host {sl.layout.name(i)} {_why(r)}" for i, r in sorted(failed.items()))
        error = HostDiedError if any(r.status == "died" for r in failed.values()) else SnapshotError
        raise error(f"{op} failed: {said}")
    refused = {i: r for i, r in sink.replies.items() if not r.get("ok", True)}
    if refused and not refusals:
        raise SnapshotError("; ".join(f"host {sl.layout.name(i)}: {r.get('error')}" for i, r in sorted(refused.items())))
    return {i: r for i, r in sink.replies.items() if "only" not in args or i == args["only"]}


def _code(op: str, args: dict, indices: list[int], per_host: dict) -> str:
    """One cell for every host: its own arguments chosen by its index, so the cell is encoded once."""
    payloads = {i: json.dumps({**args, "host": i, **per_host.get(i, {})}) for i in indices}
    return (f"__import__('tpunb_host.snapshot', fromlist=['entry']).entry(globals(), {op!r}, "
            f"{payloads!r}[int(__import__('os').environ['TPUNB_HOST_INDEX'])])")


def _why(result) -> str:
    if result.status == "died":
        return f"died ({result.detail})" if result.detail else "died"
    if result.error:
        return f"failed: {result.error['ename']}: {' '.join(str(result.error['evalue']).split())[:300]}"
    return result.status if result.status != "ok" else "gave no answer"
