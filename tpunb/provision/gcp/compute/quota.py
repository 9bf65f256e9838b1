"""The TPU quotas a launch spends, as Cloud Quotas reports them (``quotaInfos.get``), in the two
pools Google keeps apart (docs/cloud-facts.md): Compute Engine's (service compute.googleapis.com,
per region, in chips), which tpunb's Compute Engine launches spend, and the Cloud TPU API's
(tpu.googleapis.com, per zone, in TensorCores), which ``--api tpu`` spends, the one TRC and older
projects hold. Holding one buys nothing on the other.

Compute Engine's ids per generation (field reports that read them off ``gcloud quotas info``):
on-demand v6e and TPU7x spend ``TPUS-PER-TPU-FAMILY-per-project-region`` with dimension
``tpu_family`` (CT6E; TPU7x's spelled ``tpu7x`` in Google's table), v5p ``TPU-V5P-per-project-region``;
Spot and Flex-start ``PREEMPTIBLE-TPU-V6E-``, ``PREEMPTIBLE-TPU-V5P-`` and
``PREEMPTIBLE-TPU7X-per-project-region``. An unset one has no value (field reports: such a
quota has refused creates), -1 is unlimited."""
from __future__ import annotations

from dataclasses import dataclass

from tpunb import catalog
from tpunb.provision.gcp import rest

FAMILY_QUOTA = "TPUS-PER-TPU-FAMILY-per-project-region"
#: Compute Engine's: generation -> (on-demand id, its tpu_family or "", preemptible id)
COMPUTE = {"v6e": (FAMILY_QUOTA, "CT6E", "PREEMPTIBLE-TPU-V6E-per-project-region"),
           "v5p": ("TPU-V5P-per-project-region", "", "PREEMPTIBLE-TPU-V5P-per-project-region"),
           "tpu7x": (FAMILY_QUOTA, "TPU7X", "PREEMPTIBLE-TPU7X-per-project-region")}
#: the Cloud TPU API's: generation -> (on-demand id, preemptible id); per zone, in TensorCores
TPU_API = {"v6e": ("TPUV6EPerProjectPerZoneForTPUAPI", "TPUV6EPreemptiblePerProjectPerZoneForTPUAPI"),
           "v5p": ("TPUV5PPerProjectPerZoneForTPUAPI", "TPUV5PPreemptiblePerProjectPerZoneForTPUAPI")}


@dataclass(frozen=True)
class Quota:
    quota_id: str
    place: str  # the region (Compute Engine) or the zone (the Cloud TPU API)
    value: int | None  # in ``unit``; None: no value set; -1: unlimited
    unit: str = "chips"

    @property
    def region(self) -> str:
        return self.place


def quota_id(generation: str, preemptible: bool) -> str:
    on_demand, _, spot = COMPUTE[generation]
    return spot if preemptible else on_demand


def read(project: str, accelerator: str, zone: str, preemptible: bool = False) -> Quota:
    """Compute Engine's quota a launch of ``accelerator`` in ``zone`` spends (rest.ApiFailure when unreadable)."""
    acc = catalog.lookup(accelerator)
    wanted, region = quota_id(acc.generation, preemptible), catalog.region_of(zone)
    family = "" if preemptible else COMPUTE[acc.generation][1]
    return Quota(wanted, region, _value(project, "compute.googleapis.com", wanted, "region", region, family))


def read_tpu_api(project: str, accelerator: str, zone: str, preemptible: bool = False) -> Quota | None:
    """The Cloud TPU API's quota the same slice would spend with ``--api tpu`` (None: that API does
    not make the generation, as TPU7x)."""
    acc = catalog.lookup(accelerator)
    if acc.generation not in TPU_API:
        return None
    wanted = TPU_API[acc.generation][1 if preemptible else 0]
    return Quota(wanted, zone, _value(project, "tpu.googleapis.com", wanted, "zone", zone, ""), "TensorCores")


def _value(project: str, service: str, wanted: str, key: str, place: str, family: str) -> int | None:
    """The value of ``wanted`` at ``place``: the place's own entry wins over the one for every place;
    a family quota's entry for another tpu_family does not count (compared without case: Google's
    table writes TPU7x's as ``tpu7x``)."""
    info = rest.quota_info(project, wanted, service)
    own = default = None
    for entry in info.get("dimensionsInfos") or []:
        dims = entry.get("dimensions") or {}
        if dims.get(key, place) != place or str(dims.get("tpu_family", family)).upper() != family.upper():
            continue
        own, default = (entry, default) if key in dims else (own, entry)
    found = ((own or default or {}).get("details") or {}).get("value")
    return None if found is None else int(found)


def needed(accelerator: str, unit: str) -> int:
    """What a slice of ``accelerator`` spends in ``unit`` (chips, or TensorCores)."""
    acc = catalog.lookup(accelerator)
    return acc.tensorcores if unit == "TensorCores" else acc.chips
