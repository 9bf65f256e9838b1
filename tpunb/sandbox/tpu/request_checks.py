"""What the emulator is set to do (timings, faults) and the checks every request passes
before it changes any state: locations, permissions, request bodies, quota. Faults are plain
settings that change how the next calls behave; tests flip them through the admin endpoint."""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Any

from tpunb import catalog
from tpunb.sandbox.tpu.resources import ACCELERATOR_CONFIG_TYPES, ApiError, eid, error_info
from tpunb.errors import UnknownAcceleratorError

ID_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
LABEL_KEY_RE = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
LABEL_VALUE_RE = re.compile(r"^[a-z0-9_-]{0,63}$")


@dataclass
class Timings:
    """How long each phase takes, in seconds (fast defaults: the emulator serves tests)."""

    create_seconds: float = 0.5  # CREATING -> READY (also PROVISIONING -> ACTIVE)
    delete_seconds: float = 0.2  # DELETING -> gone
    queue_seconds: float = 0.3  # WAITING_FOR_RESOURCES -> PROVISIONING

    def update(self, changes: dict) -> None:
        known = {f.name for f in fields(self)}
        for key, value in changes.items():
            if key not in known:
                raise ApiError(
                    400, "INVALID_ARGUMENT", f"unknown timing {key!r}; known: {', '.join(sorted(known))}"
                )
            setattr(self, key, float(value))


@dataclass
class Faults:
    """What goes wrong on purpose. Each stays on until changed or cleared."""

    quota: str | None = None  # "operation": create operations fail with code 8; "http": create answers 429
    quota_regions: list[str] | None = None  # the quota fault only in these regions (None: everywhere)
    no_capacity: bool | list[str] = False  # stockout everywhere, or in these zones only
    permission_denied: bool | list[str] = False  # creates answer 403 (no tpu.*.create), everywhere or in these zones
    os_login: bool = False  # new VMs ignore metadata ssh-keys, as under OS Login (enable-oslogin=TRUE)
    delete_denied: bool = False  # delete calls answer 403 (caller lacks tpu.*.delete): clean-up fails
    api_disabled: bool = False  # every call answers 403 SERVICE_DISABLED
    offered: dict[str, list[str]] | None = None  # {zone: [type, ...]}: what those zones offer, not the catalog's
    slow_create: float = 0.0  # extra seconds a node stays CREATING
    preempt_after: float | None = None  # spot nodes are preempted this long after READY
    unreachable: list[str] | None = None  # zones a locations/- list cannot reach: left out, named in `unreachable`

    def update(self, changes: dict) -> None:
        known = {f.name for f in fields(self)}
        for raw_key, value in changes.items():
            key = raw_key.replace("-", "_")
            if key not in known:
                raise ApiError(
                    400, "INVALID_ARGUMENT", f"unknown fault {raw_key!r}; known: {', '.join(sorted(known))}"
                )
            setattr(self, key, _coerce_fault(key, value))

    def stockout(self, zone: str) -> bool:
        return _in(self.no_capacity, zone)

    def denied(self, zone: str) -> bool:
        return _in(self.permission_denied, zone)

    def quota_in(self, zone: str) -> str | None:
        """The quota fault's mode where ``zone``'s creates hit it, else None (quotas are regional)."""
        return self.quota if self.quota_regions is None or catalog.region_of(zone) in self.quota_regions else None


def _in(fault: bool | list[str], zone: str) -> bool:
    """A fault that is on everywhere (True) or in a list of zones."""
    return fault is True or (isinstance(fault, list) and zone in fault)


def _coerce_fault(key: str, value: Any) -> Any:
    if key == "quota":
        if value in (None, False, "", "off"):
            return None
        if value is True:
            return "operation"
        if value in ("operation", "http"):
            return value
        raise ApiError(400, "INVALID_ARGUMENT", "fault quota must be true, false, 'operation' or 'http'")
    if key in ("no_capacity", "permission_denied"):
        if isinstance(value, str):
            return [z for z in value.split(",") if z] or False
        return list(value) if isinstance(value, (list, tuple)) else bool(value)
    if key in ("quota_regions", "unreachable"):
        return None if value is None else [z for z in (value.split(",") if isinstance(value, str) else value) if z]
    if key in ("api_disabled", "delete_denied", "os_login"):
        return bool(value)
    if key == "slow_create":
        return float(value or 0)
    if key == "offered":
        return {str(z): [str(t) for t in types] for z, types in value.items()} if value else None
    return None if value is None else float(value)


class RequestChecks:
    """The checks of the Emulator's request methods (a base class: they read ``self.faults``)."""

    faults: Faults

    def _check_location(self, project: str, zone: str, wildcard: bool = False) -> None:
        if self.faults.api_disabled:
            raise ApiError(
                403,
                "PERMISSION_DENIED",
                f"Cloud TPU API has not been used in project {project} before or it is disabled. "
                "Enable it by visiting https://console.developers.google.com/apis/api/tpu.googleapis.com/"
                f"overview?project={project} then retry.",
                [
                    error_info(
                        "SERVICE_DISABLED",
                        "googleapis.com",
                        service="tpu.googleapis.com",
                        consumer=f"projects/{project}",
                    )
                ],
            )
        if not (wildcard and zone == "-") and zone not in catalog.zones() and zone not in (self.faults.offered or {}):
            raise ApiError(
                403, "PERMISSION_DENIED", f"Location {zone} is not found or access is unauthorized."
            )

    def _check_delete(self, project: str, zone: str, kind: str, resource_id: str) -> None:
        if self.faults.delete_denied:
            self._denied(project, zone, kind, resource_id, "delete")

    def _denied(self, project: str, zone: str, kind: str, resource_id: str, verb: str) -> None:
        """As the real API: a create is checked on the parent location, other verbs on the resource;
        ErrorInfo's domain is the service (tests/fixtures/cloud/permission_iam_http_403.json)."""
        permission = f"tpu.{kind}.{verb}"
        resource = f"projects/{project}/locations/{zone}" + ("" if verb == "create" else f"/{kind}/{resource_id}")
        raise ApiError(
            403,
            "PERMISSION_DENIED",
            f"Permission '{permission}' denied on resource '//tpu.googleapis.com/{resource}' (or it may not exist).",
            [error_info("IAM_PERMISSION_DENIED", "tpu.googleapis.com", permission=permission, resource=resource)],
        )

    def _check_create(self, project: str, zone: str, kind: str, resource_id: str) -> None:
        """The faults a create call hits before any validation of its body."""
        if self.faults.denied(zone):
            self._denied(project, zone, kind, resource_id, "create")
        if not ID_RE.match(resource_id or ""):
            raise ApiError(
                400,
                "INVALID_ARGUMENT",
                f'Invalid resource id "{resource_id}": use 1-63 lowercase letters, digits and hyphens, '
                "starting with a letter and not ending with a hyphen.",
            )

    def _check_node_request(self, zone: str, body: dict) -> catalog.Accelerator:
        name = body.get("acceleratorType")
        if not name:
            raise ApiError(
                400,
                "INVALID_ARGUMENT",
                "Field acceleratorType is required (acceleratorConfig is not emulated).",
            )
        try:
            acc = catalog.lookup(name)
        except UnknownAcceleratorError:
            raise ApiError(
                400,
                "INVALID_ARGUMENT",
                f'Cloud TPU received a bad request. Invalid accelerator type "{name}". {eid()}',
            ) from None
        offered = (self.faults.offered or {}).get(zone)
        if (acc.name not in offered if offered is not None else zone not in acc.zones) \
                or acc.generation not in ACCELERATOR_CONFIG_TYPES:  # no TPU7x in this API
            raise ApiError(
                400,
                "INVALID_ARGUMENT",
                f'Cloud TPU received a bad request. Accelerator type "{acc.name}" is not available '
                f'in zone "{zone}". {eid()}',
            )
        if not body.get("runtimeVersion"):
            raise ApiError(400, "INVALID_ARGUMENT", "Field runtimeVersion is required.")
        for key, value in (body.get("labels") or {}).items():
            if not LABEL_KEY_RE.match(key) or not LABEL_VALUE_RE.match(str(value)):
                raise ApiError(
                    400,
                    "INVALID_ARGUMENT",
                    f"Invalid label {key}={value}: keys and values use lowercase letters, digits, - and _ "
                    "(at most 63 characters; keys start with a letter).",
                )
        return acc

    def _quota_message(self, acc: catalog.Accelerator, zone: str, spot: bool) -> str:
        """As the real API words it: quotas are per region (docs/cloud-facts.md, marin-community/marin#87)."""
        metric = f"TPU{acc.generation.upper()}{'Preemptible' if spot else ''}PodPerProjectPerRegionForTPUAPI"
        return f"Quota '{metric}' exhausted. Limit 0 in region {catalog.region_of(zone)}"

    def _check_quota_http(self, project: str, acc: catalog.Accelerator, zone: str, spot: bool) -> None:
        if self.faults.quota_in(zone) == "http":
            message = self._quota_message(acc, zone, spot)
            raise ApiError(
                429,
                "RESOURCE_EXHAUSTED",
                message,
                [
                    {
                        "@type": "type.googleapis.com/google.rpc.QuotaFailure",
                        "violations": [{"subject": f"project:{project}", "description": message}],
                    }
                ],
            )
