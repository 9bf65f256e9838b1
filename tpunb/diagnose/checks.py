"""What every %tpu_doctor check shares: the registry of checks, their context and their rows."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


OK, WARNING, FAILED = "ok", "warning", "failed"
#: a check: its label (the table's first column) and the function that answers it
Check = tuple[str, Callable[["Context"], Any]]
#: the checks every slice gets (hosts, JAX); a backend's own come first (``provision.doctor_checks``)
CHECKS: list[Check] = []


def check(into: list[Check], label: str) -> Callable:
    """Register a check under ``label`` in the list ``into``, after those already there."""
    def register(fn: Callable[["Context"], Any]) -> Callable[["Context"], Any]:
        into.append((label, fn))
        return fn
    return register


@dataclass
class Context:
    """What the checks look at; ``memo`` lets checks share one round trip (e.g. the host probe)."""

    project: str | None
    zone: str | None
    accelerator: str | None
    slice: Any = None  # the tpunb.slice.Slice checked, if any (named, not imported: slice/ is above)
    memo: dict[str, Any] = field(default_factory=dict)
    #: the slice lives in a cloud (its backend has a cloud place): the cloud checks apply to it
    in_cloud: bool = False

    @property
    def cloud(self) -> bool:
        """Cloud checks apply: no slice (a launch is coming) or a slice in the cloud."""
        return self.slice is None or self.in_cloud


@dataclass(frozen=True)
class Row:
    check: str
    status: str
    why: str
