"""Read-only questions to the Cloud TPU API that change nothing: does a zone offer a type, which
runtime versions it has, which queued resources failed on quota, what the idle watchdog said.
%tpu_doctor and %tpu_launch ask them; they go through the same client and error translation as
``api`` (the one seam for cloud calls). What a zone offers is asked once per session."""
from __future__ import annotations

from tpunb.provision.gcp import apis
from tpunb import catalog
from tpunb.errors import ProvisionError
from tpunb.provision.gcp.tpu import api
from tpunb.provision.gcp import failures as gcp_errors
from tpunb.provision.gcp.config import cached
from tpunb.provision.gcp.tpu.records import enum_name


def _call(project: str, zone: str, what: str, fn, **kw):
    return api.call(fn, gcp_errors.Context(what, project, zone), **kw)


def offers(project: str, zone: str, accelerator: str) -> bool:
    """The zone lists ``accelerator`` among its acceleratorTypes (what create would accept)."""
    name = f"projects/{project}/locations/{zone}/acceleratorTypes/{accelerator}"
    try:
        _call(project, zone, accelerator, api.client().get_accelerator_type, name=name)
    except ProvisionError as e:
        if e.reason == "not_found":
            return False
        raise
    return True


#: failures that say the question could not be asked (not that the answer is no)
UNASKABLE = frozenset({"permission", "unavailable", "other"})


def accelerator_types(project: str, zone: str) -> frozenset[str] | None:
    """The types ``zone`` lists (acceleratorTypes), cached for the session; None when they cannot
    be read (no tpu.acceleratortypes.list, the API unreachable). A zone that does not exist raises."""
    def ask() -> frozenset[str]:
        parent = f"projects/{project}/locations/{zone}"
        pages = _call(project, zone, "accelerator types", api.client().list_accelerator_types, parent=parent)
        return frozenset(t.type_ for t in pages)

    try:  # asked once per session for each (endpoint, project, zone)
        return cached(("accelerator types", api.endpoint() or "google", project, zone), ask)
    except ProvisionError as e:
        if e.reason in UNASKABLE:
            return None
        raise


def check_offered(project: str, zone: str, accelerator: catalog.Accelerator) -> None:
    """%tpu_launch's zone check: what the API lists for the zone decides; where it cannot be asked,
    tpunb's catalog does. A one-line ProvisionError naming what the zone does offer."""
    apis.check_tpu_api(accelerator)
    offered = accelerator_types(project, zone)
    if offered is None:
        catalog.check_zone(accelerator, zone)
        return
    if accelerator.name in offered:
        return
    same = sorted((t for t in offered if t.rsplit("-", 1)[0] == accelerator.name.rsplit("-", 1)[0]),
                  key=lambda t: int(t.rsplit("-", 1)[1]) if t.rsplit("-", 1)[1].isdigit() else 0)
    listed = f"it offers {', '.join(same)}" if same else (f"it offers {', '.join(sorted(offered)[:6])}"
                                                          f"{', ...' if len(offered) > 6 else ''}" if offered else "it offers no TPU type")
    elsewhere = [z for z in accelerator.zones if z != zone][:4]
    hint = f"; zones with {accelerator.name} in tpunb's catalog: {', '.join(elsewhere)}" if elsewhere else ""
    raise ProvisionError(f"{accelerator.name} is not offered in {zone} (the Cloud TPU API lists the zone's types: "
                         f"{listed}){hint}", "invalid_accelerator")


def runtime_versions(project: str, zone: str) -> list[str]:
    """The runtime versions a zone offers."""
    parent = f"projects/{project}/locations/{zone}"
    pages = _call(project, zone, "runtime versions", api.client().list_runtime_versions, parent=parent)
    return [r.version for r in pages]


def quota_failures(project: str, zone: str) -> list[tuple[str, str]]:
    """Queued resources in the zone that FAILED on quota: (name, the API's message)."""
    parent = f"projects/{project}/locations/{zone}"
    queued = _call(project, zone, "queued resources", api.client().list_queued_resources, parent=parent)
    found = []
    for qr in queued:
        error = qr.state.failed_data.error
        if enum_name(qr.state.state) == "FAILED" and error.code == 8:  # RESOURCE_EXHAUSTED
            failure = gcp_errors.from_status(error.code, error.message)
            if gcp_errors.classify(failure) == "quota":
                found.append((qr.name.rsplit("/", 1)[-1], failure.message))
    return found


def idle_problem(project: str, zone: str, name: str) -> str | None:
    """Why the node's idle watchdog cannot delete it, as it wrote on worker 0 (guest attribute
    ``tpunb/idle-error``): "" when it can, None when it has not said (not armed yet, or unreadable)."""
    from tpunb.host.standalone.idle import ERROR_ATTRIBUTE

    from google.cloud import tpu_v2

    request = tpu_v2.GetGuestAttributesRequest(name=f"projects/{project}/locations/{zone}/nodes/{name}",
                                               query_path=ERROR_ATTRIBUTE, worker_ids=["0"])
    try:
        answer = _call(project, zone, name, api.client().get_guest_attributes, request=request)
    except ProvisionError:
        return None
    namespace, key = ERROR_ATTRIBUTE.split("/")
    for entry in answer.guest_attributes:
        for item in entry.query_value.items:
            if (item.namespace, item.key) == (namespace, key):
                return item.value
    return None
