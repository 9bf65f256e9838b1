"""tpunb's resources in a project's Compute Engine, every zone and region in one look: the survey
that finds slices no registry knows (Colab wipes the registry with its runtime), and %tpu_down of
them.

Instances carry tpunb's labels, so one aggregatedList filtered on the label finds them. MIGs,
instance templates and workload policies have no labels in the API: each carries ``MARKER`` at the
start of its description, followed by the slice's name (bodies.py), and each kind's aggregatedList
is filtered on it; a BULK MIG still waiting for capacity, with no instances yet, is found that way
too. A template or policy without its MIG (the idle watchdog deletes only the MIG, worker 0 dying
with it; a kernel that died between the creates) is a leftover, which the survey deletes.

Resources are grouped by slice name *and* launch token (common.py): two notebooks' slices of one
name (a single VM ``X`` and a MIG ``X`` do not collide in Compute Engine) are two slices, and a
registry's slice is matched by its recorded token. A MIG still waiting for capacity past the
deadline its launch stamped in its description, which no registry here holds, is deleted: no
launch waits for it any more, and it would bill once capacity came.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from tpunb.provision.gcp import apis
from tpunb import catalog, report
from tpunb.errors import ProvisionError, TpunbError
from tpunb.transport.fanout import fan_out
from tpunb.provision.gcp.config import endpoint as tpu_endpoint
from tpunb.provision.gcp.compute import clients
from tpunb.provision.gcp.shared import LAUNCH_LABEL, MARKER, read_marker
from tpunb.provision.gcp.compute.delete import teardown
from tpunb.provision.gcp.shared import NAME_LABEL, TPUNB_LABELS
from tpunb.status import OrphanStatus

#: a leftover of a slice this registry does not know is deleted only once this old: younger, it may
#: be another kernel's launch between its template and its MIG
LEFTOVER_AGE = 120.0
#: where a survey's nodes (``Survey.nodes``) hold what Compute Engine has: (project, PLACE) -> {name: Found}
PLACE = "compute-engine"
#: a slice's key in a survey: its name and the token of the launch that made it (None: made before tokens)
Key = tuple[str, "str | None"]
#: each kind's aggregatedList: the client, the scoped list's field, the filter
KINDS = {"instances": ("instances", "instances", " AND ".join(f"labels.{k} = {v}" for k, v in TPUNB_LABELS.items())),
         "migs": ("migs", "instance_group_managers", f'description eq "{MARKER}.*"'),
         "templates": ("all_templates", "instance_templates", f'description eq "{MARKER}.*"'),
         "policies": ("policies", "resource_policies", f'description eq "{MARKER}.*"')}


def surveyed() -> bool:
    """Whether a survey asks Compute Engine: always against Google; against a sandbox only when
    Compute Engine is pointed at it too (an emulated Cloud TPU API beside the real Compute Engine
    would mix a made-up project with a real one)."""
    return clients.endpoint() is not None or tpu_endpoint() is None


@dataclass
class Found:
    """One slice's resources in Compute Engine (the protos google-cloud-compute returned)."""

    name: str
    project: str
    region: str
    zone: str | None = None  # None: only regional leftovers were found
    launch: str | None = None  # the token of the launch that made it
    instances: list = field(default_factory=list)
    mig: Any = None
    template: Any = None
    policy: Any = None

    @property
    def vms(self) -> int | None:
        """2 for a MIG (its size does not matter to deleting it), 1 for an instance alone."""
        return 2 if self.mig is not None else 1 if self.instances else None

    @property
    def leftover(self) -> bool:
        """A template or policy with no MIG or instance: nothing runs, nothing is waited for."""
        return self.mig is None and not self.instances

    @property
    def age(self) -> float:
        """Seconds since its newest resource was made."""
        made = [_epoch(r.creation_timestamp) for r in (self.mig, self.template, self.policy, *self.instances) if r]
        return time.time() - max(made, default=time.time())

    def broken(self) -> bool:
        """A Spot or flex-start MIG slice that lost a VM (one not RUNNING for good, or fewer than
        its size and none being made): it cannot be whole again, and the rest bills."""
        from tpunb.provision.gcp.compute.compute_node import LOST_STATES

        if self.mig is None or not self.instances or self.model() not in ("SPOT", "FLEX_START"):
            return False
        making = any(v.status in ("PROVISIONING", "STAGING") for v in self.instances)
        return any(v.status in LOST_STATES for v in self.instances) or \
            (len(self.instances) < self.mig.target_size and not making)

    def abandoned(self) -> bool:
        """A MIG still waiting for capacity (no VM made) past the deadline its launch stamped."""
        marker = read_marker(self.mig.description) if self.mig is not None else None
        return (marker is not None and marker.deadline is not None and not self.instances
                and time.time() > marker.deadline)

    def accelerator(self) -> str:
        """Its accelerator as users name it (``tpu7x-32``), from the machine type and the policy's
        topology; "" when neither says."""
        mt = apis.machine_types().get(self.machine_type() or "")
        if mt is None:
            return ""
        topology = self.policy.workload_policy.accelerator_topology if self.policy else mt.topology
        try:
            return catalog.from_topology(mt.generation, topology).name
        except TpunbError:
            return f"{mt.name} {topology}"

    def state(self) -> str:
        if self.mig is not None:
            if self.mig.status.is_stable and self.instances:
                return "READY"
            return "WAITING_FOR_RESOURCES" if not self.instances else "CHANGING"
        if self.instances:
            return self.instances[0].status
        return "LEFTOVER"

    def machine_type(self) -> str | None:
        machine = (self.template.properties.machine_type if self.template else
                   self.instances[0].machine_type if self.instances else "")
        return machine.rsplit("/", 1)[-1] or None

    def model(self) -> str:
        """Its provisioning model (STANDARD, SPOT, FLEX_START...), "" when nothing says."""
        scheduling = (self.template.properties.scheduling if self.template else
                      self.instances[0].scheduling if self.instances else None)
        return (scheduling.provisioning_model or "STANDARD") if scheduling else ""

    def spot(self) -> bool:
        return self.model() == "SPOT"

    def orphan(self) -> OrphanStatus:
        """The row %tpu_status and the sidebar show for it."""
        from tpunb.provision.gcp.shared import price_per_hour

        accel, state = self.accelerator(), self.state()
        if self.leftover:
            what = " and ".join(k for k, r in (("instance template", self.template), ("workload policy", self.policy)) if r)
            message = f"its {what} without a MIG (a launch under way, or left behind): %tpu_down {self.name} deletes it"
        elif state == "WAITING_FOR_RESOURCES":
            message = (f"a BULK MIG waiting for capacity, in no registry here: %tpu_down {self.name} deletes it "
                       "(and its request)")
        else:
            message = (f"not in this registry and still billed (Compute Engine): %tpu_use {self.name} re-attaches it, "
                       f"%tpu_down {self.name} deletes it")
        try:
            priced = accel and not self.leftover and self.model() != "FLEX_START"  # flex-start: no source gives it
            price = price_per_hour(catalog.lookup(accel), self.spot(), 1) if priced else None
        except TpunbError:
            price = None
        uptime = None if self.leftover else self.age
        return OrphanStatus(name=self.name, accelerator=accel, num_slices=1, project=self.project,
                            zone=self.zone or self.region, state=state, spot=self.spot(), usd_per_hour=price,
                            uptime_s=uptime, message=message, backend="gcp",
                            cloud={"api": "compute", "machine_type": self.machine_type(), "cloud_state": state,
                                   "usd_per_hour": price, "uptime_s": uptime})


def _epoch(stamp: str) -> float:
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return time.time()


def slice_name(resource: Any) -> str | None:
    """Whose slice a MIG, template or policy is: the name after tpunb's marker in its description."""
    marker = read_marker(resource.description)
    return marker.slice if marker else None


def named(found: dict[Key, Found], name: str, launch: str | None = None) -> list[Found]:
    """The slices called ``name`` (with ``launch``: that launch's only; a record made before tokens
    gives None and matches any), those with a MIG or instance first."""
    return sorted((f for (n, t), f in found.items() if n == name and (launch is None or t in (launch, None))),
                  key=lambda f: f.leftover)


def _owner(vm: Any) -> str:
    """The slice an instance belongs to: tpunb's name label (a Compute Engine name is its own label
    value), else the MIG its ``created-by`` metadata names, else itself (a one-host slice is an
    instance named after it)."""
    made_by = next((i.value for i in vm.metadata.items if i.key == "created-by"), "")
    mig = made_by.rsplit("/", 1)[-1] if "/instanceGroupManagers/" in made_by else None
    return vm.labels.get(NAME_LABEL) or mig or vm.name


class Everything(dict):
    """tpunb's slices by name and launch token (Found), and the zones an aggregatedList could not
    reach (its scope's ``warning.code`` UNREACHABLE): what lives there is not in the lists."""

    unreachable: frozenset = frozenset()

    def reached(self, zone: str | None, region: str | None = None) -> bool:
        """Whether the lists saw everything of ``zone`` (or of every zone of ``region``)."""
        if zone is not None:
            return zone not in self.unreachable
        return not any(catalog.region_of(z) == region for z in self.unreachable)


def everything(project: str) -> Everything:
    """tpunb's slices in ``project`` by name and launch token, from four aggregatedList calls made at once."""
    c = clients.clients()
    unreachable: set[str] = set()

    def listed(kind: str) -> list[tuple[str, Any]]:
        attr, field_name, wanted = KINDS[kind]

        def pages() -> list[tuple[str, Any]]:  # every page, inside the one error seam
            out = []
            for scope, scoped in getattr(c, attr).aggregated_list(request={"project": project, "filter": wanted}):
                code = scoped.warning.code if "warning" in scoped else ""
                if getattr(code, "name", code) == "UNREACHABLE" and scope.startswith("zones/"):
                    unreachable.add(scope.split("/", 1)[1])
                out += [(scope, item) for item in getattr(scoped, field_name)]
            return out

        return clients.call(f"list the {kind} of {project}", pages)

    lists = fan_out(list(KINDS), listed, deadline=120.0, name="tpunb-compute-survey").by_key()
    found = Everything()
    found.unreachable = frozenset(unreachable)

    def entry(name: str, launch: str | None, scope: str) -> Found:
        where = scope.split("/", 1)[-1]
        zone = where if scope.startswith("zones/") else None
        f = found.setdefault((name, launch), Found(name, project, catalog.region_of(zone) if zone else where,
                                                   launch=launch))
        f.zone = f.zone or zone
        return f

    for scope, mig in lists["migs"]:
        if (marker := read_marker(mig.description)) is not None:
            entry(marker.slice, marker.launch, scope).mig = mig
    for scope, vm in lists["instances"]:
        entry(_owner(vm), vm.labels.get(LAUNCH_LABEL), scope).instances.append(vm)
    for kind in ("templates", "policies"):
        for scope, item in lists[kind]:
            if (marker := read_marker(item.description)) is not None and scope.startswith("regions/"):
                setattr(entry(marker.slice, marker.launch, scope), kind[:-1] if kind == "templates" else "policy", item)
    return found


class ComputeSurvey:
    """One look at a project's Compute Engine for %tpu_status: the slices there that no record
    holds (orphans), and what is deleted on the way: leftovers (those of a recorded slice whose
    launch is not under way at once, others once ``LEFTOVER_AGE`` old), and a MIG still waiting
    for capacity past its launch's deadline that no record here holds."""

    def __init__(self, project: str, recorded: dict[str, tuple[str, str | None]]) -> None:
        """``recorded``: the registry's compute slices in this project, name -> (state, launch token)."""
        self.project = project
        self.recorded = recorded
        self.found = everything(project)
        self.failed: dict[Key, str] = {}
        for key, f in list(self.found.items()):
            mine = self.holds(key)
            if f.leftover:
                if not self.found.reached(f.zone, f.region):
                    continue  # a template and policy whose MIG may be in a zone the lists could not reach stay
                if (mine and recorded[key[0]][0] == "creating") or (not mine and f.age < LEFTOVER_AGE):
                    continue
            elif not f.broken() and (mine or not f.abandoned()):
                continue
            left = teardown(project, f.zone, f.name, quiet=True, region=f.region, vms=f.vms, launch=f.launch)
            if not left:
                del self.found[key]
                if f.broken():
                    report.info(f"[tpunb] deleted {f.name} in {project}/{f.zone}: a {f.model().replace('_', '-').lower()} "
                                "MIG slice that lost a VM cannot be whole again, and the rest of it billed")
                elif not f.leftover:
                    report.info(f"[tpunb] deleted {f.name} in {project}/{f.zone}: a MIG still waiting for capacity "
                                "past its launch's deadline, which no kernel here holds")
            elif mine:
                report.warn(f"[tpunb] the leftovers of {f.name} could not be deleted{left}")
            else:
                self.failed[key] = left

    def holds(self, key: Key) -> bool:
        """A record here is this slice: its name, and its launch token (or a record without one)."""
        name, launch = key
        held = self.recorded.get(name)
        return held is not None and (held[1] is None or held[1] == launch)

    def orphans(self, known: set[str]) -> list[OrphanStatus]:
        out = []
        for key, f in sorted(self.found.items(), key=lambda item: (item[0][0], item[0][1] or "")):
            if key[0] in known and (key[0] not in self.recorded or self.holds(key)):
                continue
            row = f.orphan()
            if key in self.failed:
                row.message = f"leftovers of a launch, which could not be deleted{self.failed[key]}"
            elif f.leftover and not self.found.reached(f.zone, f.region):
                row.state = row.cloud["cloud_state"] = "UNKNOWN"
                row.message = (f"its template and policy; its MIG may be in a zone of {f.region} that Compute Engine "
                               f"could not reach now ({', '.join(sorted(self.found.unreachable))}): %tpu_status again "
                               "later")
            out.append(row)
        return out


def delete_orphan(project: str, name: str) -> bool:
    """%tpu_down of a slice no record holds: whatever of it Compute Engine has, deleted in order;
    False when it has nothing of that name; what could not go is one error with its gcloud commands."""
    every = named(everything(project), name)
    if not every:
        return False
    for f in every:
        left = teardown(project, f.zone, name, quiet=True, region=f.region, vms=f.vms, launch=f.launch)
        if left:
            raise ProvisionError(f"could not delete all of {name}{left}", reason="delete")
    f = every[0]
    report.info(f"[tpunb] deleted {name}'s Compute Engine resources in {project}/{f.zone or f.region}")
    return True
