"""The Cloud TPU checks of %tpu_doctor: credentials, project, the API, quota, the zone's types.
This backend offers them (its "doctor" capability); tpunb.doctor runs them before its own."""
from __future__ import annotations

from tpunb.provision.gcp import apis
from tpunb import catalog
from tpunb.diagnose.checks import FAILED, OK, WARNING, Check, Context, check
from tpunb.errors import ProvisionError, UnknownAcceleratorError, UsageError

#: this backend's checks, in the order the table shows them
CHECKS: list[Check] = []

QUOTAS_URL = "https://console.cloud.google.com/iam-admin/quotas?project={project}"


@check(CHECKS, "credentials")
def credentials(ctx: Context) -> tuple[str, str] | None:
    from tpunb.provision.gcp.tpu import api

    if not ctx.cloud:
        return None
    if api.endpoint():
        return OK, f"anonymous, for the Cloud TPU API emulator at {api.endpoint()} (${api.ENDPOINT_ENV})"
    try:
        from tpunb.provision.gcp import shared

        found = shared.default_credentials()
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


def on_compute(ctx: Context) -> bool:
    """The slice, or the launch being checked, goes through Compute Engine (not the Cloud TPU API):
    as its handler says (choice.py, the one place that chooses)."""
    from tpunb.provision.gcp import choice, compute
    from tpunb.provision.gcp.config import CloudOptions

    if ctx.slice is not None:
        return choice.of(ctx.slice.record) is compute
    try:
        return bool(ctx.accelerator) and choice.for_launch(catalog.lookup(ctx.accelerator), CloudOptions()) is compute
    except (UnknownAcceleratorError, UsageError):
        return False


@check(CHECKS, "API enabled")
def api_enabled(ctx: Context) -> tuple[str, str] | None:
    from tpunb.provision.gcp.tpu import api

    if not (ctx.cloud and ctx.project and ctx.zone) or on_compute(ctx):
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
    from tpunb.provision.gcp.tpu import lookups

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
    from tpunb.provision.gcp.tpu import lookups

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


@check(CHECKS, "Compute Engine API")
def compute_api(ctx: Context) -> tuple[str, str] | None:
    """TPU7x, v6e and v5p launch through Compute Engine: its API answers for the project and zone."""
    from tpunb.provision.gcp.compute import clients

    if not (ctx.cloud and ctx.project and ctx.zone and on_compute(ctx)):
        return None
    try:
        found = list(clients.call("list instances", clients.clients().instances.list, request={
            "project": ctx.project, "zone": ctx.zone, "filter": "labels.created-by=tpunb"}))
    except ProvisionError as e:
        return FAILED, str(e)
    ctx.memo["compute"] = True
    return OK, f"compute.googleapis.com answers for {ctx.project} in {ctx.zone} ({len(found)} tpunb VM" \
               f"{'s' if len(found) != 1 else ''} there)"


@check(CHECKS, "zone offers machine type")
def zone_offers_machine_type(ctx: Context) -> tuple[str, str] | None:
    """The zone has the accelerator's TPU machine type (Compute Engine's own answer: machineTypes.get)."""
    from google.api_core import exceptions

    from tpunb.provision.gcp.compute import clients, zones

    if not (ctx.memo.get("compute") and ctx.accelerator):
        return None
    shape = apis.compute_shape(ctx.accelerator)
    try:
        clients.call("read the machine type", clients.clients().machine_types.get, project=ctx.project,
                     zone=ctx.zone, machine_type=shape.machine_type)
    except exceptions.NotFound:
        try:
            have = ", ".join(zones.offered(ctx.project, shape.machine_type))
        except ProvisionError:
            have = ", ".join(shape.zones) + " (the catalog's)"
        return FAILED, f"{ctx.zone} has no {shape.machine_type} ({ctx.accelerator}): zones with it: {have}"
    except ProvisionError as e:
        return FAILED, str(e)
    return OK, f"{ctx.zone} offers {shape.machine_type} ({shape.vms} VM{'s' if shape.vms > 1 else ''} for " \
               f"{ctx.accelerator})"


@check(CHECKS, "Compute Engine TPU quota")
def compute_quota(ctx: Context) -> tuple[str, str] | None:
    """The quota the launch spends, in chips, in the zone's region (Cloud Quotas' quotaInfos.get)."""
    from tpunb.provision.gcp.compute import quota

    if not (ctx.memo.get("compute") and ctx.accelerator):
        return None
    spot = bool(ctx.slice is not None and (ctx.slice.record.spec.get("spot") or ctx.slice.record.spec.get("flex")))
    need = catalog.lookup(ctx.accelerator).chips
    limits = QUOTAS_URL.format(project=ctx.project)
    try:
        found = quota.read(ctx.project, ctx.accelerator, ctx.zone, spot)
    except ProvisionError as e:
        return WARNING, _unreadable("Compute Engine's TPU quota", e, limits)
    where = f"{found.quota_id} in {found.region}"
    if found.value is None:
        return WARNING, f"{where} has no value set (launches have been refused so): request {need} chips at {limits}"
    if 0 <= found.value < need:
        return FAILED, f"{where} is {found.value} chips, {ctx.accelerator} needs {need}: request more at {limits}"
    shown = "unlimited" if found.value < 0 else f"{found.value} chips"
    return OK, f"{where}: {shown}, {ctx.accelerator} needs {need}"


@check(CHECKS, "Cloud TPU API TPU quota (--api tpu)")
def tpu_api_quota(ctx: Context) -> tuple[str, str] | None:
    """The other pool: what the same slice would spend through the Cloud TPU API (--api tpu), per
    zone in TensorCores, the quota TRC and older projects hold; Compute Engine's is separate."""
    from tpunb.provision.gcp.compute import quota

    if not (ctx.memo.get("compute") and ctx.accelerator):
        return None
    spot = bool(ctx.slice is not None and ctx.slice.record.spec.get("spot"))
    limits = QUOTAS_URL.format(project=ctx.project)
    try:
        found = quota.read_tpu_api(ctx.project, ctx.accelerator, ctx.zone, spot)
    except ProvisionError as e:
        return WARNING, _unreadable("the Cloud TPU API's TPU quota", e, limits)
    if found is None:
        return None  # TPU7x: the Cloud TPU API does not make it
    need, where = quota.needed(ctx.accelerator, found.unit), f"{found.quota_id} in {found.place}"
    if found.value is None or 0 <= found.value < need:
        held = "no value set" if found.value is None else f"{found.value} {found.unit}"
        return OK, f"{where}: {held}, so --api tpu would not help ({ctx.accelerator} needs {need} {found.unit})"
    shown = "unlimited" if found.value < 0 else f"{found.value} {found.unit}"
    return OK, (f"{where}: {shown}, {ctx.accelerator} needs {need}: a separate pool from Compute Engine's; "
                f"%tpu_launch {ctx.accelerator} --api tpu spends it")


def _unreadable(what: str, error: ProvisionError, limits: str) -> str:
    """Why a quota could not be read, and where to look: Cloud Quotas off (or refused), or an id this
    project does not have (404: not a problem with Cloud Quotas)."""
    if getattr(error, "status", None) == 404:
        return f"Cloud Quotas does not know {what} here ({error}): see the limits at {limits}"
    return f"cannot read {what} through Cloud Quotas ({error}): enable cloudquotas.googleapis.com, or see the limits " \
           f"at {limits}"
