"""Cloud TPU API failures as one-line ProvisionErrors that say what to do next.

The same failure reaches us three ways: an HTTP error on the call (google.api_core exception
built from the response), an error in a finished long-running operation (exception built from
a google.rpc.Status code), or a queued resource's ``failedData.error``. All three become one
``Failure`` (status name, reason, raw message), are classified into a ``kind``, and get a
message written for a notebook user. The kind is kept on the error as ``.reason`` so callers
can branch (e.g. try another zone on "no_capacity") without parsing text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tpunb import catalog
from tpunb.errors import ProvisionError, UnknownAcceleratorError
from tpunb.units import either

CREDENTIALS_MESSAGE = (
    "no Google Cloud credentials: run `gcloud auth application-default login` "
    "(in Colab: `from google.colab import auth; auth.authenticate_user()`)"
)


def credentials_message() -> str:
    """The missing-credentials line; in Colab it names tpunb.colab.authenticate()."""
    from tpunb import colab

    return f"no Google Cloud credentials: {colab.SIGN_IN}" if colab.in_colab() else CREDENTIALS_MESSAGE


_GRPC_STATUS = {
    1: "CANCELLED",
    2: "UNKNOWN",
    3: "INVALID_ARGUMENT",
    4: "DEADLINE_EXCEEDED",
    5: "NOT_FOUND",
    6: "ALREADY_EXISTS",
    7: "PERMISSION_DENIED",
    8: "RESOURCE_EXHAUSTED",
    9: "FAILED_PRECONDITION",
    10: "ABORTED",
    11: "OUT_OF_RANGE",
    12: "UNIMPLEMENTED",
    13: "INTERNAL",
    14: "UNAVAILABLE",
    16: "UNAUTHENTICATED",
}
_HTTP_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ALREADY_EXISTS",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
}


@dataclass(frozen=True)
class Failure:
    """What the API said, reduced to what classification needs."""

    status: str  # google.rpc status name, e.g. "RESOURCE_EXHAUSTED"
    message: str  # the API's own message, one line, without request URL or EID
    reason: str = ""  # ErrorInfo reason, e.g. "IAM_PERMISSION_DENIED"
    permission: str = ""  # ErrorInfo metadata permission, when given


@dataclass(frozen=True)
class Context:
    """What was being attempted: enough to name alternatives in the message."""

    name: str
    project: str
    zone: str
    accelerator: str = ""
    spot: bool = False
    queued: bool = False
    cleanup: str = ""  # what was cleaned up, e.g. "deleted node n1"


def one_line(message: str, limit: int = 240) -> str:
    """The API's message without the EID tag and newlines, cut to ``limit`` characters."""
    text = " ".join(re.sub(r"\s*\[EID: [^\]]*\]", "", message or "").split()).rstrip(".")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def from_status(code: int, message: str) -> Failure:
    """A Failure from a google.rpc.Status (operation error, queued resource failedData)."""
    return Failure(_GRPC_STATUS.get(int(code), "UNKNOWN"), one_line(message))


def from_exception(exc: BaseException) -> Failure:
    """A Failure from a google.api_core exception, HTTP or operation-born."""
    message, status, reason, permission = getattr(exc, "message", "") or str(exc), "", "", ""
    body = _json_error(getattr(exc, "response", None))
    if body:
        message, status = body.get("message", message), body.get("status", "")
    grpc_code = getattr(exc, "grpc_status_code", None)
    if not status and grpc_code is not None:
        status = getattr(grpc_code, "name", "") or _GRPC_STATUS.get(int(grpc_code), "")
    if not status:
        status = _HTTP_STATUS.get(getattr(exc, "code", 0) or 0, "UNKNOWN")
    info = getattr(exc, "error_info", None)
    if info is not None:
        reason = getattr(info, "reason", "") or (info.get("reason", "") if isinstance(info, dict) else "")
        meta = getattr(info, "metadata", None) or (info.get("metadata", {}) if isinstance(info, dict) else {})
        permission = dict(meta).get("permission", "")
    if not body and re.match(r"^[A-Z]+ https?://\S+: ", message):
        message = message.split(": ", 1)[1]  # api_core prefixes "METHOD URL: "
    return Failure(status, one_line(message), reason, permission)


def _json_error(response: object) -> dict:
    try:
        payload = response.json()  # type: ignore[union-attr]
    except Exception:
        return {}
    error = payload.get("error") if isinstance(payload, dict) else None
    return error if isinstance(error, dict) else {}


def node_state(message: str) -> str | None:
    """The unusable node state an error names ("... state PREEMPTED ..."), if any."""
    found = re.search(r"\bstate:? *(PREEMPTED|TERMINATED|STOPPED|STOPPING|DELETING|HIDDEN|REPAIRING)\b", message or "")
    return found.group(1) if found else None


def classify(f: Failure) -> str:
    """One of: invalid_zone, api_disabled, preempted, credentials, permission, quota, no_capacity,
    invalid_accelerator, already_exists, not_found, invalid, unavailable, other."""
    text = f.message.lower()
    if re.search(r"location \S+ (is )?not found", text) or "unknown location" in text:
        return "invalid_zone"
    if f.reason == "SERVICE_DISABLED" or "has not been used in project" in text or "api is disabled" in text:
        return "api_disabled"
    if f.status == "ABORTED" and "preempted" in text:
        return "preempted"
    state = node_state(f.message)
    if state and f.status in ("INVALID_ARGUMENT", "FAILED_PRECONDITION"):  # a call on a node that is not READY
        return "preempted" if state == "PREEMPTED" else "lost"
    if f.status == "UNAUTHENTICATED":
        return "credentials"
    if f.status == "PERMISSION_DENIED":
        return "permission"
    if "no more capacity" in text or "stockout" in text or "insufficient reserved capacity" in text:
        return "no_capacity"
    if f.status == "RESOURCE_EXHAUSTED":
        return "quota"
    if f.status == "ALREADY_EXISTS":
        return "already_exists"
    if f.status == "NOT_FOUND":
        return "not_found"
    if f.status == "INVALID_ARGUMENT":
        return "invalid_accelerator" if "accelerator" in text else "invalid"
    if f.status in ("UNAVAILABLE", "DEADLINE_EXCEEDED", "INTERNAL"):
        return "unavailable"
    return "other"


def error(f: Failure, ctx: Context) -> ProvisionError:
    """The one-line ProvisionError for ``f``; ``.reason`` holds its kind."""
    kind = classify(f)
    text = _MESSAGES.get(kind, _other)(f, ctx)
    if ctx.cleanup:
        text = f"{text} ({ctx.cleanup})"
    return ProvisionError(text, kind)


def _zones_with(accelerator: str, except_zone: str = "", limit: int = 4) -> list[str]:
    try:
        zones = [z for z in catalog.lookup(accelerator).zones if z != except_zone]
    except UnknownAcceleratorError:
        return []
    return zones[:limit]


def _invalid_zone(f: Failure, ctx: Context) -> str:
    where = _zones_with(ctx.accelerator)
    hint = f"; {ctx.accelerator} is offered in {', '.join(where)}" if where else ""
    return (
        f"zone {ctx.zone!r} does not exist or has no Cloud TPUs for project {ctx.project}{hint}: "
        "pass another --zone"
    )


def _invalid_accelerator(f: Failure, ctx: Context) -> str:
    where = _zones_with(ctx.accelerator, ctx.zone)
    hint = f"; zones with {ctx.accelerator}: {', '.join(where)}" if where else ""
    return f"{ctx.accelerator or 'this accelerator'} cannot be created in {ctx.zone}: {f.message}{hint}"


def _api_disabled(f: Failure, ctx: Context) -> str:
    return (
        f"the Cloud TPU API is not enabled in project {ctx.project}: "
        f"run `gcloud services enable tpu.googleapis.com --project {ctx.project}`"
    )


def _credentials(f: Failure, ctx: Context) -> str:
    return f"{credentials_message()}; the API said: {f.message}"


def _permission(f: Failure, ctx: Context) -> str:
    match = re.search(r"Permission '([^']+)'", f.message)
    permission = f.permission or (match.group(1) if match else "the needed tpu.* permission")
    return (
        f"permission denied: your account lacks {permission} in project {ctx.project}; ask a project owner "
        f"for roles/tpu.admin (`gcloud projects add-iam-policy-binding {ctx.project} "
        f"--member=user:YOUR_EMAIL --role=roles/tpu.admin`)"
    )


def quota_region(message: str) -> str | None:
    """The region a quota message names ("... Limit 0 in region us-east5"): its zones share it."""
    found = re.search(r"\bin region ([a-z]+-[a-z]+\d+)", message)
    return found.group(1) if found else None


def quota_metric(message: str) -> str | None:
    """The quota an error names: "Quota 'CPUS' exceeded", "Quota limit 'TPUV6E...' has been exceeded"."""
    found = re.search(r"\bQuota (?:limit )?'([A-Za-z0-9_\-]+)'", message or "")
    return found.group(1) if found else None


def quota_kind(metric: str | None) -> str:
    """What a quota metric counts, as the user asks for more of it: TPU chips, external IPs, CPUs."""
    name = (metric or "").upper()
    if "ADDRESSES" in name or "EXTERNAL_IP" in name:
        return "external IP addresses"
    if name.startswith("CPUS") or name.endswith("_CPUS"):
        return "CPUs"
    return "TPU" if not name or "TPU" in name else name


def _quota(f: Failure, ctx: Context) -> str:
    metric = quota_metric(f.message)
    kind = quota_kind(metric)
    page = f"https://console.cloud.google.com/iam-admin/quotas?project={ctx.project}"
    options = [f"request more {kind} quota ({page})"]
    if kind == "TPU" and not ctx.spot:
        options.append("try --spot (spot has its own quota)")
    if kind == "external IP addresses":
        options.append("--internal-ip from a VM in the nodes' network (each worker takes one)")
    region = quota_region(f.message)
    options.append(f"try a zone outside {region}" if region else "try another zone")
    what = f"quota exceeded for {ctx.accelerator} in {ctx.zone} (RESOURCE_EXHAUSTED: {f.message})"
    return f"{what}: {either(options)}"


def _no_capacity(f: Failure, ctx: Context) -> str:
    others = _zones_with(ctx.accelerator, ctx.zone, limit=3)
    options = [f"try another zone ({', '.join(others)})" if others else "try another zone"]
    if not ctx.queued:
        options.append("--queued to wait for capacity")
    if not ctx.spot:
        options.append("--spot")
    return f"no capacity for {ctx.accelerator} in {ctx.zone} right now: {either(options)}"


def _preempted(f: Failure, ctx: Context) -> str:
    if node_state(f.message):  # the API refused a call on a node that was preempted since
        return _lost(f, ctx)
    return preempted_message(ctx.name, "PREEMPTED", ctx.spot)


def _lost(f: Failure, ctx: Context) -> str:
    state = node_state(f.message) or "not READY"
    why = " (spot capacity was reclaimed)" if state == "PREEMPTED" and ctx.spot else ""
    return (f"{ctx.name} is {state}{why}, so the Cloud TPU API refused the call ({f.message}): relaunch it with "
            f"%tpu_launch --recover {ctx.name}, or delete it with %tpu_down {ctx.name}")


def os_login_message(name: str, project: str, user: str, key_path: str) -> str:
    """SSH refused tpunb's key although the node's ssh-keys metadata holds it: OS Login ignores
    metadata keys (docs/cloud-facts.md), so the key must be registered with the user's account."""
    return (f"the hosts of {name} refused SSH as {user} with tpunb's key, which the node's ssh-keys metadata "
            f"holds: OS Login is probably on in project {project} (it ignores metadata keys); run `gcloud compute "
            f"os-login ssh-keys add --key-file {key_path}.pub` and relaunch with --user set to your OS Login "
            "user name")


def idle_problem_message(name: str, project: str, problem: str, compute: bool = False, boot: bool = False) -> str:
    """The one warning at launch when the slice's idle watchdog cannot delete its node (``compute``:
    its MIG or instance, which roles/compute.instanceAdmin.v1 may delete; ``boot``: the grace-only
    watchdog every Compute Engine slice has, which deletes a slice whose launch a kernel abandoned)."""
    account = re.search(r"\S+@\S+\.gserviceaccount\.com", problem)
    if problem.startswith("cannot reach"):
        fix = ("give the node's subnetwork Private Google Access (`gcloud compute networks subnets update SUBNET "
               "--region REGION --enable-private-ip-google-access`) or launch without --internal-ip")
    else:
        member = f"serviceAccount:{account.group(0)}" if account else "serviceAccount:THE_VMS_SERVICE_ACCOUNT"
        what, role = ("Compute Engine VMs and MIGs", "roles/compute.instanceAdmin.v1") if compute \
            else ("TPU nodes", "roles/tpu.admin")
        fix = (f"let the VMs' service account delete {what}: `gcloud projects add-iam-policy-binding {project} "
               f"--member={member} --role={role}`")
    who = ("the boot watchdog (which deletes a slice whose launching kernel died) cannot delete" if boot
           else "--idle-delete cannot delete")
    return f"[tpunb] {who} {name}: its watchdog says {problem}; {fix}, or delete it yourself with %tpu_down {name}"


def preempted_message(name: str, state: str, spot: bool) -> str:
    """A node lost while it was being created (spot capacity taken back, maintenance)."""
    verb = "preempted" if state == "PREEMPTED" else state.lower()
    advice = "retry, try another zone, or launch without --spot" if spot else "retry or try another zone"
    return f"{name} was {verb} while being created: {advice}"


def _already_exists(f: Failure, ctx: Context) -> str:
    return (
        f"a TPU named {ctx.name} already exists in {ctx.zone}: %tpu_use {ctx.name} attaches it, "
        f"%tpu_down {ctx.name} deletes it, or pick another name"
    )


def _not_found(f: Failure, ctx: Context) -> str:
    return f"{ctx.name} was not found in {ctx.zone} of project {ctx.project}: {f.message}"


def _invalid(f: Failure, ctx: Context) -> str:
    return f"the Cloud TPU API rejected the request for {ctx.name}: {f.message}"


def _unavailable(f: Failure, ctx: Context) -> str:
    return f"the Cloud TPU API is unavailable ({f.status}: {f.message}): retry in a minute"


def _other(f: Failure, ctx: Context) -> str:
    return f"Cloud TPU API error for {ctx.name} ({f.status}): {f.message}"


_MESSAGES = {
    "invalid_zone": _invalid_zone,
    "invalid_accelerator": _invalid_accelerator,
    "api_disabled": _api_disabled,
    "preempted": _preempted,
    "lost": _lost,
    "credentials": _credentials,
    "permission": _permission,
    "quota": _quota,
    "no_capacity": _no_capacity,
    "already_exists": _already_exists,
    "not_found": _not_found,
    "invalid": _invalid,
    "unavailable": _unavailable,
}
