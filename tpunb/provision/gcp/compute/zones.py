"""Where a Compute Engine launch goes: the zones that offer the slice's machine type, as Compute
Engine itself answers (``machineTypes.aggregatedList`` filtered on the name, asked once per
session), and the order a launch tries them in. A zone that refuses for capacity or quota is
left with nothing in it, and the next one is tried (``--zone Z1,Z2``, ``--zone any``, or no
zone where the configured one lacks the type), as the Cloud TPU path's failover does."""
from __future__ import annotations

from tpunb.provision.gcp import apis
from tpunb import catalog
from tpunb.errors import ProvisionError, UsageError
from tpunb.machine.cache import cached
from tpunb.provision.gcp.compute import clients
from tpunb.provision.gcp.config import user_region
from tpunb.provision.gcp.shared import ANY, Candidate, Outcome

#: failures another zone may not have: the launch moves on (with nothing left in the zone)
ZONE_FAILURES = frozenset({"no_capacity", "quota", "timeout"})


def offered(project: str, machine_type: str) -> tuple[str, ...]:
    """The zones whose Compute Engine offers ``machine_type`` (one call, kept for the session)."""
    def ask() -> tuple[str, ...]:
        c = clients.clients()
        pages = lambda: [scope.split("/", 1)[-1] for scope, scoped in  # noqa: E731 - every page inside the seam
                         c.machine_types.aggregated_list(request={"project": project, "filter": f"name = {machine_type}"})
                         if any(m.name == machine_type for m in scoped.machine_types)]
        return tuple(sorted(clients.call(f"list the zones with {machine_type}", pages)))

    return cached(("compute zones", clients.endpoint(), project, machine_type), ask)


def choose(project: str, shape: apis.ComputeShape, given: str | None, default: str | None) -> list[str]:
    """The zones to try, in order: ``--zone`` (Z, Z1,Z2 or any), else the configured zone, else (no
    zone anywhere, as in Colab) every zone that offers the machine type, nearest first. A named or
    configured zone without it is one line naming the zones that have it."""
    have = offered(project, shape.machine_type)
    what = f"{shape.machine_type} ({shape.accelerator})"
    if not have:
        allowlist = (": Google offers TPU7x to allowlisted projects (ask your account team to add this one)"
                     if catalog.lookup(shape.accelerator).generation == "tpu7x" else "")
        raise ProvisionError(f"no zone of {project} offers {what} through Compute Engine{allowlist}",
                             reason="invalid_zone")
    given = given or default
    if not given or given.strip().lower() == ANY:
        return catalog.nearest(have, user_region())
    named = list(dict.fromkeys(z.strip() for z in given.split(",") if z.strip()))
    lacking = [z for z in named if z not in have]
    if lacking:
        raise UsageError(f"{', '.join(lacking)} {'has' if len(lacking) == 1 else 'have'} no {what}: zones with it: "
                         f"{', '.join(have)}")
    return named


def everywhere_failed(name: str, project: str, outcomes: list[Outcome], spot: bool) -> ProvisionError:
    """One line per zone tried, then one line saying what to try."""
    kinds = {o.kind for o in outcomes}
    tips = []
    if kinds & {"no_capacity", "timeout"}:
        tips += [*([] if spot else ["--spot"]), "--flex HOURS to wait for capacity", "more zones (--zone any)"]
    if "quota" in kinds:
        tips.append(f"more quota (https://console.cloud.google.com/iam-admin/quotas?project={project})"
                    f"{other_pool(outcomes[0].candidate.accelerator) if outcomes else ''}")
    lines = [f"{name} was granted nowhere ({len(outcomes)} tries):", *(f"  {o}" for o in outcomes),
             f"try: {'; '.join(tips) or '%tpu_doctor to check the project, then retry'}"]
    return ProvisionError("\n".join(lines), reason=kinds.pop() if len(kinds) == 1 else "failover")


def other_pool(accelerator: str) -> str:
    """For a type the Cloud TPU API also makes (v6e, v5p): its quota is a pool of its own, the one
    TRC and older projects hold (docs/cloud-facts.md); "" for TPU7x, which only Compute Engine makes."""
    if apis.no_tpu_api(catalog.lookup(accelerator)):
        return ""
    return (" or --api tpu: the Cloud TPU API's TPU quota is a separate pool (the one TRC and older projects hold; "
            "%tpu_doctor reads both)")


def outcome(accelerator: str, zone: str, error: ProvisionError) -> Outcome:
    return Outcome(Candidate(accelerator, zone), error.reason or "other", str(error))


__all__ = ["ZONE_FAILURES", "choose", "everywhere_failed", "offered", "other_pool", "outcome"]
