"""The Cloud TPU checks of %tpu_doctor: credentials, project, the API, quota, the zone's types.
This backend offers them (its "doctor" capability); tpunb.doctor runs them before its own."""
from __future__ import annotations

from tpunb import catalog
from tpunb.doctor.base import FAILED, OK, WARNING, Check, Context, check
from tpunb.errors import ProvisionError, UnknownAcceleratorError

#: this backend's checks, in the order the table shows them
CHECKS: list[Check] = []

QUOTAS_URL = "https://console.cloud.google.com/iam-admin/quotas?project={project}"


@check(CHECKS, "credentials")
def credentials(ctx: Context) -> tuple[str, str] | None:
    from tpunb.provision.gcp import api

    if not ctx.cloud:
        return None
    if api.endpoint():
        return OK, f"anonymous, for the Cloud TPU API emulator at {api.endpoint()} (${api.ENDPOINT_ENV})"
    try:
        found = api.default_credentials()
    except ProvisionError as e:
        return FAILED, str(e)
    who = getattr(found, "service_account_email", None) or getattr(found, "account", None) or "your gcloud login"
    return OK, f"application default credentials ({type(found).__name__}: {who})"


@check(CHECKS, "project")
def project(ctx: Context) -> tuple[str, str] | None:
    from tpunb.provision.gcp.config import require_project_zone

    if not ctx.cloud:
        return None
    try:
        require_project_zone(ctx.project, ctx.zone)
    except ProvisionError as e:
        return FAILED, str(e)
    return OK, f"{ctx.project}, zone {ctx.zone}"


@check(CHECKS, "API enabled")
def api_enabled(ctx: Context) -> tuple[str, str] | None:
    from tpunb.provision.gcp import api

    if not (ctx.cloud and ctx.project and ctx.zone):
        return None
    try:
        nodes = api.list_nodes(ctx.project, ctx.zone)
    except ProvisionError as e:
        return FAILED, str(e)
    ctx.memo["api"] = True
    return OK, f"tpu.googleapis.com answers for {ctx.project} in {ctx.zone} ({len(nodes)} tpunb node" \
               f"{'s' if len(nodes) != 1 else ''} there)"


@check(CHECKS, "quota")
def quota(ctx: Context) -> tuple[str, str] | None:
    from tpunb.provision.gcp import lookups

    if not ctx.memo.get("api"):
        return None
    failed = lookups.quota_failures(ctx.project, ctx.zone)
    limits = QUOTAS_URL.format(project=ctx.project)
    if failed:
        name, message = failed[0]
        return WARNING, f"queued resource {name} failed on quota ({message}): raise it at {limits}"
    return OK, f"no request failed on quota in {ctx.zone} (the API reports quota only on failure; limits: {limits})"


@check(CHECKS, "zone offers type")
def zone_offers(ctx: Context) -> tuple[str, str] | None:
    from tpunb.provision.gcp import lookups

    if not (ctx.memo.get("api") and ctx.accelerator):
        return None
    try:
        acc = catalog.lookup(ctx.accelerator)
    except UnknownAcceleratorError as e:
        return FAILED, str(e)
    if not lookups.offers(ctx.project, ctx.zone, acc.name):
        others = [z for z in acc.zones if z != ctx.zone][:4]
        hint = f": zones with it: {', '.join(others)} (or --zone any)" if others else ""
        return FAILED, f"{ctx.zone} does not offer {acc.name}{hint}"
    runtimes = lookups.runtime_versions(ctx.project, ctx.zone)
    if acc.default_runtime not in runtimes:
        return WARNING, (f"{ctx.zone} offers {acc.name} but not runtime {acc.default_runtime}: pass --runtime, "
                         f"one of {', '.join(runtimes[:4])}")
    return OK, f"{ctx.zone} offers {acc.name} (runtime {acc.default_runtime})"
