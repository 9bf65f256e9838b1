"""The result of running a cell on several hosts: per-host results, and one error for all.

Like Fabric's GroupResult: a cell can succeed on some hosts and fail on others, so the result
keeps every host's outcome, and ``raise_for_status`` turns the failures into one exception that
still carries the successes.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Iterator

from tpunb.display import ANSI, format_hosts
from tpunb.errors import CellInterrupted, HostDiedError, RemoteError
from tpunb.session import HostResult


class RunResult(Mapping):
    """host index -> HostResult, in host order."""

    def __init__(self, results: dict[int, HostResult], timeout: float | None = None) -> None:
        self._results = dict(sorted(results.items()))
        self.timeout = timeout
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
        summary = ", ".join(f"{status} on {format_hosts(hosts)}" for status, hosts in by_status.items())
        return f"<RunResult: {summary}>"

    def notes(self) -> list[str]:
        """One line per host that did not simply succeed or raise."""
        lines = []
        died = self.hosts_with("died")
        if died:
            reasons = "; ".join(f"host {h}: {self._results[h].detail}" for h in died)
            lines.append(f"host{'s' if len(died) > 1 else ''} {format_hosts(died)} died during the cell "
                         f"({reasons}); the next cell restarts {'them' if len(died) > 1 else 'it'} with a fresh state")
        killed = self.hosts_with("killed")
        if killed:
            lines.append(f"host{'s' if len(killed) > 1 else ''} {format_hosts(killed)} did not stop when interrupted "
                         "and were killed (SIGTERM, then SIGKILL); the next cell restarts them with a fresh state")
        stopped = self.hosts_with("interrupted", "timeout")
        if stopped and (died or killed or self.hosts_with("timeout")):
            lines.append(f"host{'s' if len(stopped) > 1 else ''} {format_hosts(stopped)} "
                         "stopped cleanly and keep their state")
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
            rendered = [(f"[host{'s' if len(hs) > 1 else ''} {format_hosts(hs)}]", errors[hs[0]]["traceback"])
                        for hs in groups.values()]
            first = next(iter(groups))
            summary = f"{first[0]}: {first[1]}" if len(groups) == 1 else f"{len(groups)} different errors"
            raise RemoteError(f"{summary} on host{'s' if len(errors) > 1 else ''} {format_hosts(errors)}",
                              rendered, self, notes)
        failed = {h: r.exit_code for h, r in self._results.items() if r.status == "error" and r.exit_code is not None}
        if failed:
            codes = ", ".join(f"host {h}: exit {code}" for h, code in failed.items())
            raise RemoteError(f"the command failed on host{'s' if len(failed) > 1 else ''} "
                              f"{format_hosts(failed)} ({codes})", results=self, notes=notes)
        if self.hosts_with("died", "killed"):
            raise HostDiedError(" ".join(notes), self)
        timed_out = self.hosts_with("timeout")
        if timed_out:
            raise CellInterrupted(f"the cell timed out after {self.timeout:g} s and was interrupted on hosts "
                                  f"{format_hosts(timed_out)}" + ("; " + "; ".join(notes[:-1]) if len(notes) > 1 else ""),
                                  self)
        interrupted = self.hosts_with("interrupted")
        if interrupted:
            raise CellInterrupted(f"the cell was interrupted on hosts {format_hosts(interrupted)}", self)
