"""The connect diagnoses as %tpu_doctor rows: package versions that differ between hosts, a TPU
another process holds, a coordinator port the hosts cannot reach (tpunb.diagnose asks every host
once, on a side thread of its agent, so this works while a cell runs)."""
from __future__ import annotations

from tpunb import diagnose
from tpunb.doctor.base import FAILED, OK, WARNING, Context, check


def host_checks(ctx: Context) -> list[diagnose.HostCheck]:
    """Every live host's answers, asked once for the three rows below."""
    if "diagnose" not in ctx.memo:
        ctx.memo["diagnose"] = diagnose.check_hosts(ctx.slice)
    return ctx.memo["diagnose"]


def _answered(ctx: Context) -> list[diagnose.HostCheck]:
    return [c for c in host_checks(ctx) if c.error is None]


@check("package versions")
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


@check("TPU free")
def tpu_free(ctx: Context) -> tuple[str, str] | None:
    if ctx.slice is None:
        return None
    busy = [c.tpu_busy for c in _answered(ctx) if c.tpu_busy]
    if busy:
        return FAILED, busy[0] + (f" (and {len(busy) - 1} more hosts)" if len(busy) > 1 else "")
    return OK, "no other process holds a TPU device file or the libtpu lockfile"


@check("coordinator port")
def coordinator_port(ctx: Context) -> tuple[str, str] | None:
    if ctx.slice is None:
        return None
    blocked = [c.coordinator for c in _answered(ctx) if c.coordinator]
    if blocked:
        return FAILED, blocked[0] + (f" (and {len(blocked) - 1} more hosts)" if len(blocked) > 1 else "")
    return OK, "every host reaches the JAX coordinator's port"
