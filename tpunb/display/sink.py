"""What a running cell's output is handed to, as it arrives."""
from __future__ import annotations


class OutputSink:
    """Receives a cell's output as it arrives; display.CellOutput renders it for notebooks."""

    def stream(self, host: int, name: str, text: str) -> None: ...
    def display(self, host: int, data: dict, metadata: dict) -> None: ...
    def event(self, host: int, message: dict) -> None: ...
    def tick(self) -> None: ...
    def host_done(self, host: int) -> None: ...
    def finish(self) -> None: ...
    def laggards(self, where: dict[int, str]) -> None:
        """Where the hosts still running far behind the others are (host -> one line)."""

    def note(self, text: str) -> None:
        """A line of tpunb's own about the cell (where stuck hosts are), in the cell's output."""


class LogOnly(OutputSink):
    """A cell whose output is only logged (``output=None``)."""

    def __init__(self, logs) -> None:
        self.logs = logs

    def stream(self, host: int, name: str, text: str) -> None:
        self.logs.write(host, text)

    def finish(self) -> None:
        self.logs.flush()
