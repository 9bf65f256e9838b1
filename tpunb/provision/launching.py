"""The one launch driver of a cloud slice: the order of the steps, whichever API makes it.

A cloud launch is the same skeleton every time, and each step's order matters:

1. the record is saved before anything exists (a kernel that dies mid-launch leaves a trace that
   %tpu_status shows and %tpu_down cleans up);
2. the slice is made and waited for, with progress (``Plan.make``: one zone or many, the handler's
   own failover);
3. a failure or a Ctrl-C there deletes what was made and forgets the record, said in one line
   (one wording for Ctrl-C, naming the request that was waiting for capacity when there was one);
4. the hosts are reached over SSH and attached (``Plan.reach``), and a failure from here on, also
   while the manager starts the hosts, deletes the slice again (``--keep`` keeps it to look at);
5. the ready line, with what the slice costs and how it ends.

A handler (tpunb/provision/gcp/tpu, tpunb/provision/gcp/compute) supplies the verbs as a ``Plan``;
the driver owns the order, the rollback and the wording.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Protocol

from tpunb import report
from tpunb.errors import CellInterrupted, HostSetupError
from tpunb.provision.base import LaunchRequest, Made
from tpunb.registry import SliceRecord
from tpunb.units import format_duration


class Plan(Protocol):
    """One launch as a handler prepared it: everything checked, nothing made yet."""

    record: SliceRecord  #: its record, state "creating"
    title: str  #: the progress line's title
    price: float | None  #: per hour, None when no source gives one
    unpriced: str  #: what the cost says without a price
    notes: list[str]  #: lines said once the progress shows (what a queued request's limit is)

    def make(self, progress: Any) -> None:
        """Create the slice and wait until it is up (in as many zones as it takes); fill
        ``record.hosts``. What it made in a zone that refused is gone before it tries the next."""

    def undo(self, exc: BaseException) -> str:
        """After ``make`` failed or was interrupted: delete what it made; "" when nothing is left,
        else what is (the commands that delete it)."""

    def waiting(self, progress: Any) -> str | None:
        """On a Ctrl-C in ``make``: the request that was waiting for capacity ("its queued resource
        request (WAITING_FOR_RESOURCES)"), or None for a plain create."""

    def explain(self, exc: BaseException) -> None:
        """Add why to a failure of ``make`` before it is said (what the launch read beforehand)."""

    def reach(self, env: dict[str, str]) -> Made:
        """Connect to every host and attach the slice (agents not started)."""

    def close(self) -> None:
        """Stop watching the slice (a launch that failed after ``reach`` made its node)."""

    def delete(self) -> str:
        """Delete the slice after ``reach`` (or starting its hosts) failed; "" when all of it went."""

    def refused(self, exc: BaseException) -> BaseException | None:
        """The error to say when the hosts refused this kernel's key (OS Login, most often), or None."""

    def setup_hint(self, exc: HostSetupError) -> str:
        """What to add to a failure to prepare the hosts (why they could not reach PyPI)."""

    def keep(self, exc: BaseException, progress: Any) -> bool:
        """--keep: the slice stays, recorded as kept, for a look; False without it (or on Ctrl-C)."""

    def check(self, sl: Any) -> None:
        """Once the hosts run: say at once whatever keeps the slice's own watchdog from working."""

    def ready(self, seconds: float) -> str:
        """The ready line, after ``seconds`` of launch."""


def launch(plan: Plan, request: LaunchRequest) -> Made:
    """Run ``plan`` in the driver's order (see the module's docstring); the Made the manager starts."""
    from tpunb.widgets.launch import LaunchProgress

    reg, name, record = request.registry, request.name, plan.record
    reg.save_slice(record)  # before anything exists: even a crashed kernel leaves a trace to clean up
    progress = LaunchProgress(plan.title, plan.price, plan.unpriced)
    for note in plan.notes:
        report.info(note)
    started = time.perf_counter()

    def failed(exc: BaseException) -> None:
        """The hosts could not be reached or started (or Ctrl-C came then): the slice is deleted
        (or kept with --keep), and the progress line says so."""
        plan.close()
        if plan.keep(exc, progress):
            return
        reg.delete_slice(name)
        fate = f"deleted{plan.delete()}"
        refused = plan.refused(exc)
        if refused is not None:
            progress.failed(f"could not connect to the hosts, so {name} was {fate}: {refused}")
            raise refused from None
        if isinstance(exc, HostSetupError):
            exc.args = (f"{exc}{plan.setup_hint(exc)}; so {name} was {fate} (--keep keeps it to look at)",)
            progress.failed(str(exc))
            return
        if isinstance(exc, KeyboardInterrupt):
            progress.failed(f"interrupted while it reached or started the hosts, so {name} was {fate}")
            return
        progress.failed(f"could not reach or start the hosts, so {name} was {fate}: {exc}")

    try:
        plan.make(progress)
    except BaseException as exc:
        left = plan.undo(exc)
        reg.delete_slice(name)
        if isinstance(exc, KeyboardInterrupt):
            message = interrupted(name, plan.waiting(progress), left, time.perf_counter() - started)
            progress.failed(message)
            raise CellInterrupted(message) from None
        plan.explain(exc)
        progress.failed(f"failed: {(str(exc) or repr(exc)).splitlines()[0]}{left}")  # the error says the rest
        raise
    try:  # from here to the return, a failure or a Ctrl-C deletes the slice (``failed``)
        record.state = "running"
        made = plan.reach(request.env)
        return dataclasses.replace(made, check=plan.check, failed=failed,
                                   ready=lambda: progress.done(plan.ready(time.perf_counter() - started)))
    except BaseException as exc:
        failed(exc)
        raise


def interrupted(name: str, waiting: str | None, left: str, seconds: float) -> str:
    """The one line a Ctrl-C during a launch ends with: what was deleted, and that nothing is left."""
    if waiting:
        return (f"launch of {name} interrupted after {format_duration(seconds)}: {waiting} was deleted"
                f"{left or ', nothing is left running or waiting'}")
    return f"launch of {name} interrupted: what it had created was deleted{left or ', nothing is left running'}"
