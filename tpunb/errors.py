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


class HostSetupError(ProvisionError):
    """A host's environment could not be made: ``causes`` maps each cause (one line) to the hosts
    it stopped, so the message names every host and why, once per cause."""

    def __init__(self, host: int | dict, address: str = "", cause: str = "") -> None:
        self.causes: dict[str, list[int]] = host if isinstance(host, dict) else {cause: [host]}
        self.address = address
        where = f" ({address})" if address and not isinstance(host, dict) else ""
        parts = [f"host{'s' if len(hosts) > 1 else ''} {_hosts(hosts)}{where}: {why}" for why, hosts in self.causes.items()]
        super().__init__("cannot prepare " + "; ".join(parts), reason="setup")

    @classmethod
    def merge(cls, errors: list["HostSetupError"]) -> "HostSetupError":
        """Several hosts' failures as one error, hosts with the same cause named together."""
        causes: dict[str, list[int]] = {}
        for error in errors:
            for why, hosts in error.causes.items():
                causes.setdefault(why, []).extend(hosts)
        if len(errors) == 1:
            return errors[0]
        return cls({why: sorted(hosts) for why, hosts in causes.items()})


def _hosts(hosts: list[int]) -> str:
    """0-3,5: host numbers as ranges."""
    hosts, runs = sorted(hosts), []
    for host in hosts:
        if runs and host == runs[-1][1] + 1:
            runs[-1][1] = host
        else:
            runs.append([host, host])
    return ",".join(f"{a}-{b}" if b > a else f"{a}" for a, b in runs)


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


class FetchFailed(TpunbError):
    """A %tpu_fetch that could not put the files on every host; ``kind`` names the cause (disk,
    verify, source, network, host, cancelled). Nothing that looks complete is left half-written."""

    def __init__(self, message: str, kind: str = "") -> None:
        super().__init__(message)
        self.kind = kind


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
