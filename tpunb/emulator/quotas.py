"""Cloud Quotas' ``quotaInfos.get`` for compute.googleapis.com, as the sandbox answers it: the TPU
quotas a Compute Engine launch spends (``TPUS-PER-TPU-FAMILY-per-project-region`` with dimensions
region and tpu_family, ``PREEMPTIBLE-TPU-<GEN>-per-project-region`` with region), in chips.

Values: the Compute Engine fault ``quotas`` ({quota id: {region: value, or null for no value}})
says them; else 0 where the quota fault is on (its regions), and 2048 chips elsewhere (a synthetic
default: a project's real values are its own). Any other quota id is 404, as an unknown one is."""
from __future__ import annotations

import re
from typing import Any

from tpunb.emulator.resources import ApiError

DEFAULT_CHIPS = 2048
KNOWN = re.compile(r"^(TPUS-PER-TPU-FAMILY|PREEMPTIBLE-TPU-(V6E|TPU7X|V5P))-per-project-region$")


def quota_info(project: str, service: str, quota_id: str, faults: dict, quota_regions: list[str] | None,
               quota_on: bool) -> dict:
    if service != "compute.googleapis.com" or not KNOWN.match(quota_id):
        raise ApiError(404, "NOT_FOUND", f"QuotaInfo {quota_id} of service {service} not found.")
    name = f"projects/{project}/locations/global/services/{service}/quotaInfos/{quota_id}"
    family = quota_id.startswith("TPUS-PER-TPU-FAMILY")
    set_values: dict[str, Any] = (faults.get("quotas") or {}).get(quota_id) or {}
    infos = []
    for region, value in set_values.items():
        infos.append(_info(region, value))
    if quota_on:  # the quota fault: nothing left where it applies
        infos += [_info(r, 0) for r in (quota_regions or []) if r not in set_values]
        if quota_regions is None:
            infos.append(_info(None, 0))
    if not quota_on or quota_regions is not None:
        infos.append(_info(None, DEFAULT_CHIPS))
    return {"name": name, "quotaId": quota_id, "metric": f"compute.googleapis.com/{quota_id.split('-per-')[0].lower()}",
            "service": service, "isPrecise": True, "containerType": "PROJECT",
            "dimensions": ["region", "tpu_family"] if family else ["region"], "dimensionsInfos": infos,
            "quotaDisplayName": quota_id, "refreshInterval": "minute"}


def _info(region: str | None, value: int | None) -> dict:
    """One dimensionsInfo: a region's value (None: the default for every region); no value: empty details."""
    return {"dimensions": {"region": region} if region else {},
            "details": {} if value is None else {"value": str(int(value))},
            "applicableLocations": [region] if region else ["global"]}
