"""One exception tree for tpunb.

Every error tpunb raises on purpose derives from TpunbError. Its message is one line that
says what went wrong and what to do next; IPython renders it without our own traceback
(``_render_traceback_``), because a stack of tpunb internals helps no notebook user.
"""
from __future__ import annotations


class TpunbError(Exception):
    """Base of every error tpunb raises on purpose."""

    def _render_traceback_(self) -> list[str]:
        return [f"{type(self).__name__}: {self}"]


class UsageError(TpunbError):
    """Bad arguments to a magic or an API call."""


class OwnedElsewhere(TpunbError):
    """The slice belongs to a live kernel and its hosts cannot be ended from here."""


class UnknownAcceleratorError(TpunbError, ValueError):
    """An accelerator name that is not in the catalog; the message suggests close names."""


class NoSliceError(TpunbError):
    """No slice is launched or attached, or the named slice does not exist."""


class ProvisionError(TpunbError):
    """Creating, finding or deleting a slice failed; ``reason`` names the kind (quota,
    no_capacity, permission, timeout, preempted, ...) so callers branch without parsing text."""

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason


class TransportError(TpunbError):
    """Bytes could not reach a host: connection, authentication, host key or a dead agent.

    ``failures`` maps each host that failed (its address) to its own error, when several were tried.
    """

    def __init__(self, message: str, failures: dict | None = None) -> None:
        super().__init__(message)
        self.failures = failures or {}


class SyncError(TransportError):
    """Copying files to some hosts failed; ``report`` says what reached the others."""

    def __init__(self, message: str, failures: dict | None = None, report=None) -> None:
        super().__init__(message, failures)
        self.report = report


class HostKeyError(TransportError):
    """A host presented a key that differs from the one recorded for it."""


class AuthenticationError(TransportError):
    """A host rejected our SSH key."""


class ProtocolError(TransportError):
    """The agent on a host speaks another protocol version or sent a malformed frame."""


class HostDiedError(TransportError):
    """A host process ended while tpunb was talking to it; ``results`` has the cell's per-host
    results when it happened during a cell."""

    def __init__(self, message: str, results=None) -> None:
        super().__init__(message)
        self.results = results


class RemoteError(TpunbError):
    """User code raised on one or more hosts; renders the hosts' own tracebacks.

    ``groups`` holds (hosts label, traceback lines) with identical tracebacks merged, and
    ``results`` the per-host results of the whole cell, successes included.
    """

    def __init__(self, message: str, groups: list | None = None, results=None, notes: list | None = None) -> None:
        super().__init__(message)
        self.groups = groups or []
        self.results = results
        self.notes = notes or []

    def _render_traceback_(self) -> list[str]:
        if not self.groups:
            return [f"{type(self).__name__}: {self}"] + self.notes
        lines: list[str] = []
        for hosts, traceback_lines in self.groups:
            lines.append(f"\x1b[1;31m{hosts}\x1b[0m")
            lines.extend(traceback_lines)
        return lines + self.notes


class SnapshotError(TpunbError):
    """A snapshot or restore cannot be made as asked (a name missing, a value that does not
    pickle, a spec that does not fit the new slice, no space left); nothing half-done is left."""


class CellInterrupted(TpunbError):
    """A cell was interrupted (kernel interrupt or --timeout) on every host; ``results`` has what ran."""

    def __init__(self, message: str, results=None) -> None:
        super().__init__(message)
        self.results = results


class ServiceError(TpunbError):
    """A service on a host failed to start, exited or never answered; ``host`` names the host and
    ``tail`` holds the service's last log lines, shown under the one-line message."""

    def __init__(self, message: str, host: int | None = None, tail: str = "") -> None:
        super().__init__(message)
        self.host = host
        self.tail = tail

    def _render_traceback_(self) -> list[str]:
        return [f"{type(self).__name__}: {self}"] + [f"  | {line}" for line in self.tail.splitlines()]
