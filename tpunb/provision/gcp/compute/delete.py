"""Deleting one slice's Compute Engine resources, in the order the API allows: the MIG (or the
instance), then the instance template, then the workload policy (a template or policy a MIG still
uses cannot go first). What cannot be deleted is said as the exact gcloud commands that delete it,
so a user can finish by hand what tpunb could not."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tpunb import catalog, report
from tpunb.errors import TpunbError
from tpunb.provision.gcp.compute import clients
from tpunb.provision.gcp.compute.bodies import Names


def steps(project: str, zone: str | None, name: str, region: str | None = None,
          vms: int | None = None) -> list[tuple[str, Callable[[], Any]]]:
    """Each resource slice ``name`` may have, in deletion order: its gcloud command and the delete
    call. ``zone`` None: only the regional ones (a template and policy left without their MIG);
    ``vms`` 1: the instance alone, more: the MIG and what it uses, None (not known): all of them."""
    c, names = clients.clients(), Names(name)
    region = region or catalog.region_of(str(zone))
    mig = [(f"gcloud compute instance-groups managed delete {name} --zone {zone} --project {project}",
            lambda: c.migs.delete_unary(project=project, zone=zone, instance_group_manager=name))]
    instance = [(f"gcloud compute instances delete {name} --zone {zone} --project {project}",
                 lambda: c.instances.delete_unary(project=project, zone=zone, instance=name))]
    if vms == 1:
        return instance
    zonal = (mig + ([] if vms else instance)) if zone else []
    return zonal + [
        (f"gcloud compute instance-templates delete {names.template} --region {region} --project {project}",
         lambda: c.templates.delete_unary(project=project, region=region, instance_template=names.template)),
        (f"gcloud compute resource-policies delete {names.policy} --region {region} --project {project}",
         lambda: c.policies.delete_unary(project=project, region=region, resource_policy=names.policy)),
    ]


def teardown(project: str, zone: str | None, name: str, quiet: bool = False, region: str | None = None,
             vms: int | None = None) -> str:
    """Delete whatever exists of slice ``name``, waiting for each deletion. "" when nothing is left,
    else the text that says what is left and the gcloud commands that delete it (a step that
    failed leaves every later one too: what depends on it cannot go either)."""
    from google.api_core import exceptions

    left: list[str] = []
    for command, delete_it in steps(project, zone, name, region, vms):
        if left:
            left.append(command)
            continue
        try:
            clients.wait(project, clients.call(f"delete ({command})", delete_it), f"delete ({command})")
        except exceptions.NotFound:
            continue
        except TpunbError as exc:
            left.append(command)
            if not quiet:
                report.warn(f"[tpunb] {exc}")
    if not left:
        return ""
    return "; still there, delete with: " + "; ".join(left)
