"""The names a Compute Engine launch takes, checked before it makes anything and after: the
instance or MIG named after the slice, its template and its workload policy. Another notebook's
slice of that name, one's own orphan from an earlier kernel, or a resource tpunb did not make is
refused in one line that says what exists and what to do, and nothing of it is touched.

The look before creating is only advisory: two launches of one name can both pass it. Compute
Engine then answers 409 to the second create of a name (``taken``). A single VM ``X`` and a MIG
``X`` do not collide in Compute Engine, so after its VM or MIG exists a launch looks once more
(``check_alone``): of two slices named alike, the younger steps back and deletes only its own."""
from __future__ import annotations

from typing import Any

from tpunb import catalog
from tpunb.errors import ProvisionError
from tpunb.provision.gcp.shared import launch_of, read_marker, same_launch
from tpunb.provision.gcp.compute import clients
from tpunb.provision.gcp.compute.bodies import Names
from tpunb.provision.gcp.shared import OWNER_LABEL

#: the reason of every refusal here (not a zone's failure: another zone would not help)
TAKEN = "exists"


def _look(project: str, zone: str, name: str, kinds: tuple[str, ...]) -> list[tuple[str, Any]]:
    """(kind, resource) of each of ``kinds`` that exists under the slice's names."""
    from google.api_core import exceptions

    c, names, region = clients.clients(), Names(name), catalog.region_of(zone)
    readers = {"instance": lambda: c.instances.get(project=project, zone=zone, instance=name),
               "MIG": lambda: c.migs.get(project=project, zone=zone, instance_group_manager=name),
               "instance template": lambda: c.templates.get(project=project, region=region,
                                                            instance_template=names.template),
               "workload policy": lambda: c.policies.get(project=project, region=region, resource_policy=names.policy)}
    found = []
    for kind in kinds:
        try:
            found.append((kind, clients.call(f"read the {kind} of {name}", readers[kind])))
        except exceptions.NotFound:
            continue
    return found


ALL = ("instance", "MIG", "instance template", "workload policy")


def check_free(project: str, zone: str, name: str, launch: str) -> None:
    """Before anything is made: a ProvisionError (``TAKEN``) when any name this launch will use
    is held by a resource that is not this launch's."""
    for kind, resource in _look(project, zone, name, ALL):
        if not same_launch(resource, launch):
            raise refusal(project, zone, name, kind, resource)


def taken(project: str, zone: str, name: str, launch: str) -> ProvisionError:
    """Compute Engine answered 409 to a create of this launch: the same refusal, naming what holds
    the name now (another launch got there between this one's look and its create)."""
    held = [(kind, r) for kind, r in _look(project, zone, name, ALL) if not same_launch(r, launch)]
    if held:
        return refusal(project, zone, name, *held[0])
    return ProvisionError(f"{name} was taken in {project}/{zone} by another launch while this one made it: "
                          f"%tpu_status shows it, %tpu_use {name} attaches it", reason=TAKEN)


def check_alone(project: str, zone: str, name: str, launch: str, multi_host: bool) -> None:
    """Once this launch's VM (or MIG) exists: when a MIG (or VM) of the same name is another
    launch's, the younger of the two steps back (the older may be running cells already)."""
    mine = _look(project, zone, name, ("MIG",) if multi_host else ("instance",))
    other = _look(project, zone, name, ("instance",) if multi_host else ("MIG",))
    if not mine or not other or same_launch(other[0][1], launch):
        return
    ours, theirs = mine[0][1], other[0][1]
    if (ours.creation_timestamp, launch) > (theirs.creation_timestamp, launch_of(theirs) or ""):
        raise refusal(project, zone, name, *other[0])


def refusal(project: str, zone: str, name: str, kind: str, resource: Any) -> ProvisionError:
    """One line: what holds the name, whose it is, and what to do."""
    where = f"{project}/{zone}" if kind in ("instance", "MIG") else f"{project}/{catalog.region_of(zone)}"
    made_by_tpunb = read_marker(getattr(resource, "description", "")) is not None or \
        (getattr(resource, "labels", None) or {}).get("created-by") == "tpunb"
    if not made_by_tpunb:
        return ProvisionError(f"{name} is taken in {where}: {kind} {resource.name} exists and tpunb did not make it; "
                              "launch with another --name", reason=TAKEN)
    owner = (getattr(resource, "labels", None) or {}).get(OWNER_LABEL)
    whose = f", launched by {owner}" if owner else ""
    return ProvisionError(f"{name} is taken in {where}: the {kind} {resource.name} of another tpunb launch exists"
                          f"{whose}; %tpu_use {name} attaches it, %tpu_down {name} deletes it, or launch with "
                          "another --name", reason=TAKEN)
