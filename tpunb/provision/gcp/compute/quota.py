"""Compute Engine's TPU quota for a launch, as Cloud Quotas reports it: the quota a slice spends
(docs/cloud-facts.md; field reports: on-demand spends ``TPUS-PER-TPU-FAMILY-per-project-region``
with dimension ``tpu_family``, Spot and Flex-start ``PREEMPTIBLE-TPU-V6E-per-project-region``),
read with ``quotaInfos.get`` of service compute.googleapis.com. Its value is in chips, per region;
an unset one has no value (field reports: such a quota has refused creates), -1 is unlimited."""
from __future__ import annotations

from dataclasses import dataclass

from tpunb import catalog
from tpunb.provision.gcp import rest

ON_DEMAND = "TPUS-PER-TPU-FAMILY-per-project-region"
#: the tpu_family dimension: CT6E as field reports quote it; TPU7X and CT5P by analogy (synthetic)
FAMILY = {"v6e": "CT6E", "tpu7x": "TPU7X", "v5p": "CT5P"}
#: the preemptible quota's generation part: V6E as field reports quote it; TPU7X and V5P by analogy (synthetic)
PREEMPTIBLE = {"v6e": "V6E", "tpu7x": "TPU7X", "v5p": "V5P"}


@dataclass(frozen=True)
class Quota:
    quota_id: str
    region: str
    value: int | None  # chips; None: no value set; -1: unlimited


def quota_id(generation: str, preemptible: bool) -> str:
    return f"PREEMPTIBLE-TPU-{PREEMPTIBLE[generation]}-per-project-region" if preemptible else ON_DEMAND


def read(project: str, accelerator: str, zone: str, preemptible: bool = False) -> Quota:
    """The quota a launch of ``accelerator`` in ``zone`` spends (rest.ApiFailure when unreadable)."""
    acc = catalog.lookup(accelerator)
    wanted, region = quota_id(acc.generation, preemptible), catalog.region_of(zone)
    info = rest.quota_info(project, wanted)
    own = default = None  # the region's own entry wins over the one for every region, set or not
    for entry in info.get("dimensionsInfos") or []:
        dims = entry.get("dimensions") or {}
        if dims.get("region", region) == region and dims.get("tpu_family", FAMILY[acc.generation]) == FAMILY[acc.generation]:
            own, default = (entry, default) if "region" in dims else (own, entry)
    found = ((own or default or {}).get("details") or {}).get("value")
    value = None if found is None else int(found)
    return Quota(wanted, region, value)
