"""%tpu_doctor: what stands between this notebook and a working slice, one row per check.

Each check is a small function registered with ``@check(CHECKS, "label")`` (tpunb.diagnose.checks),
in the order the table shows: the slice's backend's own checks first (the cloud's credentials,
project, API and quota: ``provision.doctor_checks``), then the modules imported below. It takes
the ``Context`` (project, zone, accelerator, the slice if one is attached) and returns
``(status, why)``: "ok", "warning" or "failed" and one line, or None where it does not apply (no
host checks without a slice, no cloud checks for a local slice). A check that raises becomes a
failed row with the error's first line, so one broken check never hides the others.
"""
from __future__ import annotations

from typing import Any

from tpunb.diagnose import host_checks as hosts, jax_ready  # noqa: F401 - importing them registers their checks, in this order
from tpunb.diagnose.checks import CHECKS, FAILED, Check, Context, Row


class Report(list):
    """The rows of one %tpu_doctor run; prints as a table."""

    title: str = ""

    @property
    def ok(self) -> bool:
        return all(row.status != FAILED for row in self)

    def __str__(self) -> str:
        width = max([len(r.check) for r in self] + [5])
        lines = [self.title] if self.title else []
        lines += [f"{r.check:<{width}}  {r.status:<7}  {r.why}" for r in self]
        return "\n".join(lines)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self))


def run(ctx: Context, first: list[Check] | None = None) -> Report:
    """The checks ``first`` (a backend's own), then every registered check, on ``ctx``, in order."""
    rows = Report()
    for label, fn in [*(first or []), *CHECKS]:
        try:
            answer = fn(ctx)
        except Exception as e:  # one broken check must not hide the others
            text = (str(e) or type(e).__name__).splitlines()[0]
            answer = (FAILED, f"{type(e).__name__}: {text}" if not str(e) else text)
        if answer is not None:
            rows.append(Row(label, *answer))
    return rows


def doctor(name: str | None = None, accelerator: str | None = None, zone: str | None = None,
           project: str | None = None) -> Report:
    """Check the slice ``name`` (default: the current one, if any), or, with no slice, what a
    launch of ``accelerator`` in ``project``/``zone`` needs. Returns the rows; print() shows them."""
    from tpunb import provision, manager
    from tpunb.errors import NoSliceError

    sl = None
    try:
        sl = manager.current(name)
    except NoSliceError:
        if name:
            raise
    place = provision.cloud_place(sl.record) if sl is not None else None
    if place is not None:
        project, zone = project or place[0], zone or place[1]
    else:
        project, zone = provision.default_place(project, zone)
    accelerator = accelerator or (sl.record.accelerator if sl is not None else None)
    report = run(Context(project, zone, accelerator, sl, in_cloud=place is not None),
                 provision.doctor_checks(sl.record if sl is not None else None))
    where = f"slice {sl.name!r} ({sl.kind}, {sl.backend})" if sl is not None else "no slice attached"
    report.title = f"tpu_doctor: {where}; project {project or '?'}, zone {zone or '?'}"
    return report
