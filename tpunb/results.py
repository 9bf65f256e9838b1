"""The result of running a cell on several hosts: what each host did (``HostResult``), and all of
them together with one error for all (``RunResult``).

Like Fabric's GroupResult: a cell can succeed on some hosts and fail on others, so the result
keeps every host's outcome, and ``raise_for_status`` turns the failures into one exception that
still carries the successes.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Iterator

from tpunb.display import ANSI
from tpunb.display.hosts import HostNames, format_hosts
from tpunb.errors import CellInterrupted, HostDiedError, RemoteError

#: how much of each host's stdout and stderr a result keeps in memory (the logs keep everything)
TAIL_CHARS = 1 << 20
#: how many of a cell's displays a result keeps (the newest)
KEEP_DISPLAYS = 100
#: the detail of a host whose agent %tpu_restart replaced while a cell ran on it
RESTARTED = "it was restarted (%tpu_restart)"


class Tail:
    """The last ``limit`` characters of a stream; adding is O(len(text)), whatever came before."""

    def __init__(self, limit: int = TAIL_CHARS) -> None:
        self.limit = limit
        self._chunks: list[str] = []
        self._size = 0
        self.total = 0  # characters ever added

    def add(self, text: str) -> None:
        self._chunks.append(text)
        self._size += len(text)
        self.total += len(text)
        if self._size > 2 * self.limit:
            self._compact()

    def _compact(self) -> None:
        joined = "".join(self._chunks)[-self.limit:]
        self._chunks, self._size = [joined], len(joined)

    @property
    def truncated(self) -> bool:
        return self.total > self.limit

    def __str__(self) -> str:
        if len(self._chunks) > 1 or self._size > self.limit:
            self._compact()
        return self._chunks[0] if self._chunks else ""


@dataclass
class HostResult:
    """What one host did with one cell. ``stdout``/``stderr`` are the last TAIL_CHARS characters
    (``stdout_truncated`` says when more came); the host's log file has all of it."""

    host: int
    status: str = "running"  # ok | error | interrupted | timeout | died | killed | not run
    value: dict | None = None  # the last expression's mime bundle ({"text/plain": ...})
    displays: list[dict] = field(default_factory=list)  # the newest KEEP_DISPLAYS
    error: dict | None = None  # {"ename", "evalue", "traceback": [lines]}
    seconds: float | None = None
    detail: str = ""  # why a host died or was killed
    exit_code: int | None = None  # shell commands (%tpu_run)
    where: str = ""  # where it was when it would not stop (its main thread's stack, in one line)
    #: made at a stream's first text: most hosts of most cells print nothing (256 results a cell)
    tails: dict[str, Tail] = field(default_factory=dict, repr=False)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def stdout(self) -> str:
        return str(self.tails["stdout"]) if "stdout" in self.tails else ""

    @property
    def stderr(self) -> str:
        return str(self.tails["stderr"]) if "stderr" in self.tails else ""

    @property
    def stdout_truncated(self) -> bool:
        return "stdout" in self.tails and self.tails["stdout"].truncated

    @property
    def stderr_truncated(self) -> bool:
        return "stderr" in self.tails and self.tails["stderr"].truncated


class RunResult(Mapping):
    """host index -> HostResult, in host order."""

    def __init__(self, results: dict[int, HostResult], timeout: float | None = None,
                 names: HostNames = format_hosts) -> None:
        self._results = dict(sorted(results.items()))
        self.timeout = timeout
        self.names = names  # how messages name hosts: '0-3', or 's1/3' in a multislice
        self.extra_notes: list[str] = []  # e.g. why hosts died, from the cloud

    def __getitem__(self, host: int) -> HostResult:
        return self._results[host]

    def __iter__(self) -> Iterator[int]:
        return iter(self._results)

    def __len__(self) -> int:
        return len(self._results)

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self._results.values())

    @property
    def stdout(self) -> dict[int, str]:
        return {h: r.stdout for h, r in self._results.items()}

    @property
    def reprs(self) -> dict[int, str | None]:
        """Each host's last-expression value as text (its text/plain repr), or None."""
        return {h: (r.value or {}).get("text/plain") for h, r in self._results.items()}

    def hosts_with(self, *statuses: str) -> list[int]:
        return [h for h, r in self._results.items() if r.status in statuses]

    def __repr__(self) -> str:
        by_status: dict[str, list[int]] = {}
        for host, result in self._results.items():
            by_status.setdefault(result.status, []).append(host)
        summary = ", ".join(f"{status} on {self.names(hosts)}" for status, hosts in by_status.items())
        return f"<RunResult: {summary}>"

    def notes(self) -> list[str]:
        """One line per host that did not simply succeed or raise."""
        lines = []
        died = self.hosts_with("died")
        restarted = [h for h in died if self._results[h].detail.startswith(RESTARTED)]
        if restarted:
            many = len(restarted) > 1
            lines.append(f"host{'s' if many else ''} {self.names(restarted)} {'were' if many else 'was'} restarted "
                         "(%tpu_restart) while the cell ran: the cell's work there is lost")
            died = [h for h in died if h not in restarted]
        for host in [h for h in died if self._results[h].detail.startswith("stopped answering")]:
            lines.append(f"host {self.names([host])} {self._results[host].detail} and was ended; the next cell restarts it "
                         "with a fresh state")
        if [h for h in died if not self._results[h].detail.startswith("stopped answering")]:
            died = [h for h in died if not self._results[h].detail.startswith("stopped answering")]
            reasons = "; ".join(f"host {self.names([h])}: {self._results[h].detail}" for h in died)
            lines.append(f"host{'s' if len(died) > 1 else ''} {self.names(died)} died during the cell "
                         f"({reasons}); the next cell restarts {'them' if len(died) > 1 else 'it'} with a fresh state")
        killed = self.hosts_with("killed")
        if killed:
            many = len(killed) > 1
            cause = f"the cell passed its {self.timeout:g} s timeout; " if self.timeout and not died else ""
            where = "".join(f"; host {self.names([h])} was at {self._results[h].where}" for h in killed
                            if self._results[h].where)
            lines.append(f"{cause}host{'s' if many else ''} {self.names(killed)} did not stop when interrupted "
                         f"and {'were' if many else 'was'} killed (SIGTERM, then SIGKILL{where}); the next cell "
                         f"restarts {'them' if many else 'it'} with a fresh state, or %tpu_restart restarts every "
                         "host now")
        stopped = self.hosts_with("interrupted", "timeout")
        if stopped and (died or killed or self.hosts_with("timeout")):
            many = len(stopped) > 1
            lines.append(f"host{'s' if many else ''} {self.names(stopped)} stopped cleanly and "
                         f"{'keep their' if many else 'keeps its'} state")
        return lines + self.extra_notes

    def raise_for_status(self) -> None:
        """Raise one exception describing every failure; return quietly if all hosts succeeded."""
        notes = self.notes()
        errors = {h: r.error for h, r in self._results.items() if r.error and r.status == "error"}
        if errors:
            groups: dict[tuple, list[int]] = {}
            for host, error in errors.items():
                key = (error["ename"], error["evalue"], ANSI.sub("", "\n".join(error["traceback"])))
                groups.setdefault(key, []).append(host)
            rendered = [(f"[host{'s' if len(hs) > 1 else ''} {self.names(hs)}]", errors[hs[0]]["traceback"])
                        for hs in groups.values()]
            first = next(iter(groups))
            summary = f"{first[0]}: {first[1]}" if len(groups) == 1 else f"{len(groups)} different errors"
            raise RemoteError(f"{summary} on host{'s' if len(errors) > 1 else ''} {self.names(errors)}",
                              rendered, self, notes)
        failed = {h: r.exit_code for h, r in self._results.items() if r.status == "error" and r.exit_code is not None}
        if failed:
            codes = ", ".join(f"host {self.names([h])}: exit {code}" for h, code in failed.items())
            raise RemoteError(f"the command failed on host{'s' if len(failed) > 1 else ''} "
                              f"{self.names(failed)} ({codes})", results=self, notes=notes)
        if self.hosts_with("died", "killed"):
            raise HostDiedError("; ".join(notes), self)
        timed_out = self.hosts_with("timeout")
        if timed_out:
            raise CellInterrupted(f"the cell timed out after {self.timeout:g} s and was interrupted on hosts "
                                  f"{self.names(timed_out)}" + ("; " + "; ".join(notes[:-1]) if len(notes) > 1 else ""),
                                  self)
        interrupted = self.hosts_with("interrupted")
        if interrupted:
            raise CellInterrupted(f"the cell was interrupted on hosts {self.names(interrupted)}", self)
