"""Cloud Quotas' ``quotaInfos.get`` as the sandbox answers it: the TPU quotas of Compute Engine
(service compute.googleapis.com, per region, in chips) and of the Cloud TPU API (tpu.googleapis.com,
per zone, in TensorCores): two separate pools, as Google meters them (docs/cloud-facts.md).

Compute Engine's ids: on-demand ``TPUS-PER-TPU-FAMILY-per-project-region`` (dimensions region and
tpu_family: CT6E, TPU7X) and ``TPU-V5P-per-project-region``; Spot and Flex-start
``PREEMPTIBLE-TPU-V6E-per-project-region``, ``PREEMPTIBLE-TPU-V5P-per-project-region`` and
``PREEMPTIBLE-TPU7X-per-project-region``. The Cloud TPU API's: ``TPUV6EPerProjectPerZoneForTPUAPI``,
``TPUV5PPerProjectPerZoneForTPUAPI`` and their ``...Preemptible...`` twins (dimension zone).

Values: the Compute Engine fault ``quotas`` ({quota id: {region or zone: value, or null for no
value}}) says them; else 0 where the quota fault is on (its regions), and a synthetic default
elsewhere (2048 chips, 4096 TensorCores: a project's real values are its own). Compute Engine
refuses an insert past its pool's value (compute.py); an unset value refuses too (field reports: an
unset family quota "inherits 0"). Any other quota id is 404, as an unknown one is."""
from __future__ import annotations

import re
from typing import Any

from tpunb.sandbox.tpu.resources import ApiError

DEFAULT_CHIPS = 2048
DEFAULT_CORES = 4096
COMPUTE = re.compile(r"^(TPUS-PER-TPU-FAMILY|TPU-V5P|PREEMPTIBLE-TPU-(V6E|V5P)|PREEMPTIBLE-TPU7X)-per-project-region$")
TPU_API = re.compile(r"^TPUV(6E|5P)(Preemptible)?PerProjectPerZoneForTPUAPI$")
#: Compute Engine's quota per generation: (on-demand id, its tpu_family, preemptible id)
COMPUTE_IDS = {"v6e": ("TPUS-PER-TPU-FAMILY-per-project-region", "CT6E", "PREEMPTIBLE-TPU-V6E-per-project-region"),
               "v5p": ("TPU-V5P-per-project-region", "", "PREEMPTIBLE-TPU-V5P-per-project-region"),
               "tpu7x": ("TPUS-PER-TPU-FAMILY-per-project-region", "TPU7X", "PREEMPTIBLE-TPU7X-per-project-region")}


def compute_quota_id(generation: str, model: str) -> str:
    """The quota a Compute Engine VM of ``generation`` spends under provisioning ``model``."""
    on_demand, _, preemptible = COMPUTE_IDS[generation]
    return preemptible if model in ("SPOT", "FLEX_START") else on_demand


def metric_name(service: str, quota_id: str) -> str:
    """The metric a quota id counts (a quotaInfo's ``metric``, a QUOTA_EXCEEDED's ``metricName``):
    synthetic, as no report quotes a TPU one."""
    metric = quota_id.split("-per-")[0].lower() if service == "compute.googleapis.com" else \
        re.sub(r"PerProject.*", "", quota_id).lower()
    return f"{service}/{metric}"


def limit(faults: dict, quota_id: str, place: str) -> int | None:
    """The pool's value at ``place`` (a region, or a zone for the Cloud TPU API) from the ``quotas``
    fault, else the default; None when it is set to no value."""
    set_values: dict[str, Any] = (faults.get("quotas") or {}).get(quota_id) or {}
    if place in set_values:
        return None if set_values[place] is None else int(set_values[place])
    return DEFAULT_CORES if TPU_API.match(quota_id) else DEFAULT_CHIPS


def quota_info(project: str, service: str, quota_id: str, faults: dict, quota_regions: list[str] | None,
               quota_on: bool) -> dict:
    compute = service == "compute.googleapis.com" and COMPUTE.match(quota_id)
    tpu_api = service == "tpu.googleapis.com" and TPU_API.match(quota_id)
    if not (compute or tpu_api):
        raise ApiError(404, "NOT_FOUND", f"QuotaInfo {quota_id} of service {service} not found.")
    name = f"projects/{project}/locations/global/services/{service}/quotaInfos/{quota_id}"
    key = "region" if compute else "zone"
    set_values: dict[str, Any] = (faults.get("quotas") or {}).get(quota_id) or {}
    infos = [_info(key, place, value) for place, value in set_values.items()]
    if quota_on and compute:  # the quota fault: nothing left where it applies
        infos += [_info(key, r, 0) for r in (quota_regions or []) if r not in set_values]
        if quota_regions is None:
            infos.append(_info(key, None, 0))
    if not (quota_on and compute) or quota_regions is not None:
        infos.append(_info(key, None, DEFAULT_CHIPS if compute else DEFAULT_CORES))
    family = quota_id.startswith("TPUS-PER-TPU-FAMILY")
    return {"name": name, "quotaId": quota_id, "metric": metric_name(service, quota_id), "service": service,
            "isPrecise": True, "containerType": "PROJECT", "dimensions": [key, "tpu_family"] if family else [key],
            "dimensionsInfos": infos, "quotaDisplayName": quota_id, "refreshInterval": "minute"}


def _info(key: str, place: str | None, value: int | None) -> dict:
    """One dimensionsInfo: a region's (zone's) value (None: the default for every one); no value: empty details."""
    return {"dimensions": {key: place} if place else {},
            "details": {} if value is None else {"value": str(int(value))},
            "applicableLocations": [place] if place else ["global"]}
