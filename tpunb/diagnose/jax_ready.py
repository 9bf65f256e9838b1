"""The connect diagnoses as %tpu_doctor rows: package versions that differ between hosts, a TPU
another process holds, a coordinator port the hosts cannot reach (tpunb.diagnose asks every host
once, on a side thread of its agent, so this works while a cell runs)."""
from __future__ import annotations

from tpunb import diagnose
from tpunb.diagnose.checks import CHECKS, FAILED, OK, WARNING, Context, check


def host_checks(ctx: Context) -> list[diagnose.HostCheck]:
    """Every live host's answers, asked once for the three rows below."""
    if "diagnose" not in ctx.memo:
        ctx.memo["diagnose"] = diagnose.check_hosts(ctx.slice)
    return ctx.memo["diagnose"]


def _answered(ctx: Context) -> list[diagnose.HostCheck]:
    return [c for c in host_checks(ctx) if c.error is None]


@check(CHECKS, "package versions")
def package_versions(ctx: Context) -> tuple[str, str] | None:
    if ctx.slice is None:
        return None
    checks = host_checks(ctx)
    failed = [c for c in checks if c.error]
    if failed:
        return FAILED, f"host {ctx.slice.layout.names([c.host for c in failed])} could not be checked: {failed[0].error}"
    line = diagnose.skew_line({c.host: c.versions for c in checks}, ctx.slice.layout.names)
    if line:
        return WARNING, f"{line} (%tpu_status --versions lists them all)"
    return OK, f"{len(checks)} host{'s' if len(checks) != 1 else ''} run the same Python, jax, jaxlib, libtpu and flax"


def _first_problem(ctx: Context, field: str, fine: str) -> tuple[str, str] | None:
    """FAILED with the first host's line for ``field`` (and how many more hosts have one), else OK."""
    if ctx.slice is None:
        return None
    lines = [getattr(c, field) for c in _answered(ctx) if getattr(c, field)]
    if lines:
        return FAILED, lines[0] + (f" (and {len(lines) - 1} more hosts)" if len(lines) > 1 else "")
    return OK, fine


@check(CHECKS, "TPU free")
def tpu_free(ctx: Context) -> tuple[str, str] | None:
    return _first_problem(ctx, "tpu_busy", "no other process holds a TPU device file or the libtpu lockfile")


@check(CHECKS, "coordinator port")
def coordinator_port(ctx: Context) -> tuple[str, str] | None:
    return _first_problem(ctx, "coordinator", "every host reaches the JAX coordinator's port")
