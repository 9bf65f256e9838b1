"""What every %tpu_doctor check shares: the registry of checks, their context and their rows."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tpunb.slice import Slice

OK, WARNING, FAILED = "ok", "warning", "failed"
CHECKS: list[tuple[str, Callable[["Context"], Any]]] = []


def check(label: str) -> Callable:
    """Register a check under ``label`` (the table's first column), after those already there."""
    def register(fn: Callable[["Context"], Any]) -> Callable[["Context"], Any]:
        CHECKS.append((label, fn))
        return fn
    return register


@dataclass
class Context:
    """What the checks look at; ``memo`` lets checks share one round trip (e.g. the host probe)."""

    project: str | None
    zone: str | None
    accelerator: str | None
    slice: "Slice | None" = None
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
