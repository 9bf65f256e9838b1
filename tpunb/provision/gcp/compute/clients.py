"""The one seam for every Compute Engine call: google-cloud-compute's clients, built once per
kernel against $TPUNB_COMPUTE_API_ENDPOINT (the sandbox) or Google, and the wait for an operation.

google-cloud-compute's ``insert(...).result()`` polls through a new operations client that drops
the endpoint (it would ask the real API), so calls here are ``*_unary`` and their operations are
waited for with a zone or region operations client built with the same options (NOTES.md)."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

from tpunb.errors import ProvisionError
from tpunb.provision import warm
from tpunb.machine.cache import cached
from tpunb.provision.gcp import shared
from tpunb.provision.gcp.shared import google_message

ENDPOINT_ENV = "TPUNB_COMPUTE_API_ENDPOINT"
#: how long the client waits for one operations.wait answer: Compute Engine holds the call until the
#: operation is DONE or for "no more than the 2 minutes" (zoneOperations.wait's reference page), so
#: longer than that; a client timeout first (a slow network) asks again
WAIT_SLICE = 150.0


def endpoint() -> str | None:
    """The Compute Engine API endpoint override (the sandbox's URL), or None for Google's."""
    return os.environ.get(ENDPOINT_ENV, "").strip().rstrip("/") or None


@dataclass(frozen=True)
class Clients:
    instances: Any
    templates: Any  # regional instance templates
    all_templates: Any  # instance templates of every region (aggregatedList)
    policies: Any  # resource policies (workload policies)
    migs: Any  # zonal managed instance groups
    zone_ops: Any
    region_ops: Any
    machine_types: Any


def clients() -> Clients:
    """The clients for this endpoint, made once per kernel."""
    url = endpoint()
    return cached(("compute clients", url), lambda: _make(url))


def _options(url: str | None) -> dict[str, Any]:
    """The keyword arguments every client gets: anonymous against the sandbox, else the credentials."""
    warm.ready(*warm.COMPUTE_MODULES)  # imported on a side thread since %load_ext: a Ctrl-C cannot cut it
    from google.api_core.client_options import ClientOptions

    if url:
        from google.auth.credentials import AnonymousCredentials

        return {"credentials": AnonymousCredentials(), "client_options": ClientOptions(api_endpoint=url)}
    return {"credentials": shared.default_credentials()}


def client(kind: str) -> Any:
    """Another google-cloud-compute client (``RoutersClient``, ``ReservationsClient``...), made once
    per kernel with the same options as the others."""
    url = endpoint()

    def make() -> Any:
        kw = _options(url)
        from google.cloud import compute_v1

        return getattr(compute_v1, kind)(**kw)

    return cached(("compute client", kind, url), make)


def _make(url: str | None) -> Clients:
    kw = _options(url)  # first: it readies the import where Ctrl-C cannot cut it
    from google.cloud import compute_v1

    return Clients(compute_v1.InstancesClient(**kw), compute_v1.RegionInstanceTemplatesClient(**kw),
                   compute_v1.InstanceTemplatesClient(**kw),
                   compute_v1.ResourcePoliciesClient(**kw), compute_v1.InstanceGroupManagersClient(**kw),
                   compute_v1.ZoneOperationsClient(**kw), compute_v1.RegionOperationsClient(**kw),
                   compute_v1.MachineTypesClient(**kw))


def call(what: str, fn, *args: Any, **kwargs: Any) -> Any:
    """One API call; Google's error becomes one line naming ``what`` (NotFound passes as it is)."""
    from google.api_core import exceptions

    try:
        return fn(*args, **kwargs)
    except exceptions.NotFound:
        raise
    except exceptions.GoogleAPICallError as exc:
        reason = _reason(exc)
        raise ProvisionError(f"Compute Engine refused to {what}: {google_message(exc)}", reason=reason) from None


def _reason(exc: Any) -> str:
    """A short reason for the error tree: quota, no_capacity, permission, exists, invalid or api."""
    text = str(getattr(exc, "message", "") or exc)
    code = getattr(exc, "code", None)
    found = reason_of(text)
    if found != "api":
        return found
    if code == 403:
        return "permission"
    if code == 409:  # alreadyExists: the name is held (claims.py says by what)
        return "exists"
    return "invalid" if code == 400 else "api"


def reason_of(text: str) -> str:
    """What an error code or message of Compute Engine's means: quota, no_capacity, else api."""
    lowered = text.lower()
    if "quota" in lowered:
        return "quota"
    if any(s in lowered for s in ("resource_pool_exhausted", "does not have enough resources", "stockout")):
        return "no_capacity"
    return "api"


def wait(project: str, operation: Any, what: str, deadline: float | None = None, flex: bool = False) -> None:
    """Until ``operation`` (zonal or regional) is DONE; its error as one line naming ``what``
    (``flex``: flex-start, whose INTERNAL_ERROR field reports saw where other tries said stockout:
    no capacity)."""
    from google.cloud import compute_v1
    from requests.exceptions import Timeout

    while True:
        if operation.status == compute_v1.Operation.Status.DONE:
            break
        c = clients()
        if deadline is not None and time.monotonic() > deadline:
            raise ProvisionError(f"Compute Engine did not finish to {what} in time", reason="timeout")
        scope = (operation.zone or operation.region).rsplit("/", 1)[-1]
        ops, where = (c.zone_ops, {"zone": scope}) if operation.zone else (c.region_ops, {"region": scope})
        try:
            operation = call(what, ops.wait, project=project, operation=operation.name, timeout=WAIT_SLICE, **where)
        except Timeout:  # the answer took longer than the client waits: not an error, ask again
            continue
    errors = list(operation.error.errors) if operation.error else []
    if errors:
        first = errors[0]
        reason = "no_capacity" if flex and first.code == "INTERNAL_ERROR" else reason_of(first.code)
        raise ProvisionError(f"Compute Engine could not {what}: {first.message} ({first.code})"
                             f"{more(reason, project)}", reason=reason)


def more(reason: str, project: str) -> str:
    """Where a quota refusal is fixed (Compute Engine's TPU quotas are their own, per region; the
    launch adds the Cloud TPU API's pool where it applies: zones.other_pool)."""
    if reason != "quota":
        return ""
    return f"; request more at https://console.cloud.google.com/iam-admin/quotas?project={project}"
