"""Deleting one slice's Compute Engine resources, in the order the API allows: the MIG (or the
instance), then the instance template, then the workload policy (a template or policy a MIG still
uses cannot go first). What cannot be deleted is said as the exact gcloud commands that delete it,
so a user can finish by hand what tpunb could not.

Given the slice's launch token, each resource is read first and deleted only if it carries that
token (common.py): a failed launch never deletes another notebook's slice of the same name, nor
one's own orphan."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tpunb import catalog, report
from tpunb.errors import TpunbError
from tpunb.provision.gcp.shared import same_launch
from tpunb.provision.gcp.compute import clients
from tpunb.provision.gcp.compute.bodies import Names


@dataclass(frozen=True)
class Step:
    """One resource of a slice: its gcloud delete command, how to read it and how to delete it."""

    command: str
    read: Callable[[], Any]
    delete: Callable[[], Any]


def steps(project: str, zone: str | None, name: str, region: str | None = None, vms: int | None = None) -> list[Step]:
    """Each resource slice ``name`` may have, in deletion order. ``zone`` None: only the regional
    ones (a template and policy left without their MIG); ``vms`` 1: the instance alone, more: the
    MIG and what it uses, None (not known): all of them."""
    c, names = clients.clients(), Names(name)
    region = region or catalog.region_of(str(zone))
    where = {"project": project, "zone": zone}
    mig = [Step(f"gcloud compute instance-groups managed delete {name} --zone {zone} --project {project}",
                lambda: c.migs.get(**where, instance_group_manager=name),
                lambda: c.migs.delete_unary(**where, instance_group_manager=name))]
    instance = [Step(f"gcloud compute instances delete {name} --zone {zone} --project {project}",
                     lambda: c.instances.get(**where, instance=name),
                     lambda: c.instances.delete_unary(**where, instance=name))]
    if vms == 1:
        return instance
    zonal = (mig + ([] if vms else instance)) if zone else []
    regional = {"project": project, "region": region}
    return zonal + [
        Step(f"gcloud compute instance-templates delete {names.template} --region {region} --project {project}",
             lambda: c.templates.get(**regional, instance_template=names.template),
             lambda: c.templates.delete_unary(**regional, instance_template=names.template)),
        Step(f"gcloud compute resource-policies delete {names.policy} --region {region} --project {project}",
             lambda: c.policies.get(**regional, resource_policy=names.policy),
             lambda: c.policies.delete_unary(**regional, resource_policy=names.policy)),
    ]


def teardown(project: str, zone: str | None, name: str, quiet: bool = False, region: str | None = None,
             vms: int | None = None, launch: str | None = None) -> str:
    """Delete whatever exists of slice ``name`` (with ``launch``: only what carries that launch
    token), waiting for each deletion. "" when nothing is left, else the text that says what is
    left and the gcloud commands that delete it (a step that failed leaves every later one too:
    what depends on it cannot go either)."""
    from google.api_core import exceptions

    left: list[str] = []
    for step in steps(project, zone, name, region, vms):
        if left:
            left.append(step.command)
            continue
        try:
            if launch and not same_launch(clients.call(f"read ({step.command})", step.read), launch):
                continue  # another launch's (another notebook's slice of this name): never touched
            clients.wait(project, clients.call(f"delete ({step.command})", step.delete), f"delete ({step.command})")
        except exceptions.NotFound:
            continue
        except TpunbError as exc:
            left.append(step.command)
            if not quiet:
                report.warn(f"[tpunb] {exc}")
    if not left:
        return ""
    return "; still there, delete with: " + "; ".join(left)
