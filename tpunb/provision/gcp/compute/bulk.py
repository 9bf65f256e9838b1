"""The wait for a BULK MIG, read as Compute Engine reports it, so that a refusal ends the launch at
once and says why (docs/cloud-facts.md, Compute Engine: MIG status).

A BULK MIG that cannot make all its VMs keeps trying; it lists its managed instances at once, each
with a name but no ``instanceStatus`` nor ``id`` until it exists (flex-start members show
PENDING), so their count says nothing. What says why is read on every look: the MIG's
``status.bulkInstanceOperation.lastProgressCheck.error`` (Google's channel for it, several codes
at once), its members' ``lastAttempt.errors``, its ``listErrors``, and its applied topology's
state. Quotas are named from ``errorDetails[].quotaInfo``, not from the message.

Two limits. The wait for capacity is ``--timeout``. Once the bulk operation is over and every
member exists, activation starts, with a limit of its own that grows with the VMs: a large healthy
slice still activating is not deleted. A capacity code (``ZONE_RESOURCE_POOL_EXHAUSTED*``; under
flex-start also ``INTERNAL_ERROR``, field reports) ends the wait only when the launch is not
flex-start and another zone is left to try; any other code, a topology FAILED, or one INCOMPLETE
once every VM exists, ends it at once."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from tpunb.errors import ProvisionError
from tpunb.provision.gcp import shared
from tpunb.provision.gcp.config import format_duration
from tpunb.provision.gcp.compute import clients

#: what a flex-start wait is called on the launch line (and what an interrupt there says it cut short)
WAITING = "waiting for capacity (flex-start)"
#: activation (every VM made, the topology not yet ACTIVE) may take this long, plus ACTIVATION_PER_VM a VM
ACTIVATION_BASE, ACTIVATION_PER_VM = 600.0, 30.0
CAPACITY_CODES = ("ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS")
#: under flex-start, field reports saw INTERNAL_ERROR where other tries of the same shape said stockout
FLEX_CAPACITY_CODES = (*CAPACITY_CODES, "INTERNAL_ERROR")


def activation_limit(vms: int) -> float:
    return ACTIVATION_BASE + ACTIVATION_PER_VM * vms


@dataclass(frozen=True)
class Problem:
    """One error Compute Engine reports for the MIG: its code, message and the quota it names."""

    code: str
    message: str
    quota: str = ""  # "TPUS-PER-TPU-FAMILY-per-project-region (limit 0 in us-east5)", from quotaInfo

    def capacity(self, flex: bool) -> bool:
        return self.code in (FLEX_CAPACITY_CODES if flex else CAPACITY_CODES)

    def said(self) -> str:
        if self.quota:
            return f"quota {self.quota} exceeded"
        return f"{self.message} ({self.code})" if self.code and self.code not in self.message else self.message


def problems(errors: Any) -> list[Problem]:
    """The Problems of a compute v1 ``Error`` (its ``errors[]``), quotas named from quotaInfo."""
    found = []
    for e in getattr(errors, "errors", None) or []:
        quota = next((d.quota_info for d in e.error_details if d.quota_info and d.quota_info.limit_name), None)
        named = ""
        if quota is not None:
            region = dict(quota.dimensions).get("region")
            named = f"{quota.limit_name} (limit {quota.limit:g}{f' in {region}' if region else ''})"
        found.append(Problem(e.code, " ".join(e.message.split()), named))
    return found


@dataclass
class Look:
    """The MIG as one round of calls shows it."""

    target: int
    stable: bool
    in_progress: bool
    members: list = field(default_factory=list)  # ManagedInstance
    topology: list[tuple[str, list[Problem]]] = field(default_factory=list)  # (state, its errors)
    problems: list[Problem] = field(default_factory=list)

    @property
    def running(self) -> int:
        return sum(m.instance_status == "RUNNING" and m.current_action == "NONE" for m in self.members)

    @property
    def pending(self) -> bool:
        """Flex-start members waiting for capacity (PENDING), none made yet."""
        return bool(self.members) and all(m.instance_status in ("PENDING", "") and not m.id for m in self.members) \
            and any(m.instance_status == "PENDING" for m in self.members)

    @property
    def made(self) -> bool:
        """The bulk operation is over and every member exists (a status and an id each)."""
        return (not self.in_progress and len(self.members) == self.target > 0
                and all(m.instance_status and m.id for m in self.members))

    @property
    def ready(self) -> bool:
        return self.stable and [s for s, _ in self.topology] == ["ACTIVE"] and self.running == self.target == \
            len(self.members)

    def line(self, flex: bool) -> str:
        states = "/".join(s for s, _ in self.topology) or "pending"
        if flex and not self.made and (self.pending or not self.members):
            return f"{WAITING}: {self.running}/{self.target} VMs"
        return f"{self.running}/{self.target} VMs running, topology {states}"


def look(project: str, zone: str, name: str) -> Look:
    """One look at the MIG: get (its status), listManagedInstances, listErrors."""
    c, where = clients.clients(), {"project": project, "zone": zone, "instance_group_manager": name}
    group = clients.call("read the MIG", c.migs.get, **where)
    members = list(clients.call("list the MIG's VMs", c.migs.list_managed_instances, **where))
    listed = clients.call("read the MIG's errors", c.migs.list_errors, **where)
    status = group.status
    seen = problems(status.bulk_instance_operation.last_progress_check.error)
    for member in members:
        seen += problems(member.last_attempt.errors)
    seen += [Problem(e.error.code, " ".join(e.error.message.split())) for e in listed if e.error and e.error.code]
    topology = [(t.state, problems(t.state_details.error)) for t in status.applied_accelerator_topologies]
    return Look(group.target_size, status.is_stable, status.bulk_instance_operation.in_progress, members, topology,
                list(dict.fromkeys(seen)))


def wait_up(project: str, zone: str, name: str, say, deadline: float, flex: bool = False,
            more_zones: bool = False, more: str = "") -> None:
    """Until the MIG is stable, its topology ACTIVE and every VM RUNNING with no current action;
    a refusal ends it at once (see the module's docstring). ``deadline``: the capacity wait's end
    (monotonic); ``more``: what a quota refusal adds (where to get quota)."""
    activating_until: float | None = None
    for delay in shared.poll_delays():
        seen = look(project, zone, name)
        say(seen.line(flex), 0.0)
        if seen.ready:
            return
        _refuse(name, seen, flex, more_zones, more)
        now = time.monotonic()
        if seen.made and activating_until is None:  # capacity came: activation has a limit of its own
            activating_until = now + activation_limit(seen.target)
        if activating_until is not None and now > activating_until:
            states = "/".join(s for s, _ in seen.topology) or "not reported"
            raise ProvisionError(f"the MIG {name} made its {seen.target} VMs but was not ready within "
                                 f"{format_duration(activation_limit(seen.target))} ({seen.running} running, topology "
                                 f"{states})", reason="timeout")
        if activating_until is None and now > deadline:
            why = "; ".join(dict.fromkeys(p.said() for p in seen.problems[-3:]))
            if flex:
                raise ProvisionError(f"no capacity came for the MIG {name} before --timeout: it was waiting for "
                                     f"capacity{f' ({why})' if why else ''}", reason="timeout")
            raise ProvisionError(f"no capacity came for the MIG {name} before --timeout: "
                                 f"{why or 'Compute Engine listed no error'}", reason="timeout")
        shared.pause(delay)


def _refuse(name: str, seen: Look, flex: bool, more_zones: bool, more: str) -> None:
    """Raise at once for what waiting will not change."""
    for state, errors in seen.topology:
        if state == "FAILED" or (state == "INCOMPLETE" and seen.made):
            why = "; ".join(p.said() for p in errors) or "Compute Engine gave no reason"
            raise ProvisionError(f"the MIG {name}'s accelerator topology is {state}: {why}", reason="failed")
    if seen.made:
        return  # what was listed while it waited no longer matters: its VMs exist
    refusals = [p for p in seen.problems if not p.capacity(flex)]
    if refusals:
        first = refusals[0]
        reason = clients.reason_of(first.code) if clients.reason_of(first.code) != "api" else \
            clients.reason_of(first.message)
        what = "is over quota for" if reason == "quota" else "cannot make"
        raise ProvisionError(f"the MIG {name} {what} its {seen.target} VMs: {first.said()}"
                             f"{more if reason == 'quota' else ''}", reason=reason)
    capacity = [p for p in seen.problems if p.capacity(flex)]
    if capacity and not flex and more_zones:  # BULK would wait for all of them: another zone may have them now
        raise ProvisionError(f"the MIG {name} has no capacity for its {seen.target} VMs: {capacity[-1].said()}",
                             reason="no_capacity")
