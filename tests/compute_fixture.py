"""What tests of tpunb's Compute Engine backend share: Google's own google-cloud-compute client
pointed at a sandbox (what a user's gcloud would see there), and tpunb pointed at the sandbox."""
from __future__ import annotations

from collections.abc import Iterator

import pytest
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1

from tpunb.provision.gcp import apis
from tpunb import catalog, manager
from tpunb.sandbox.box import start_sandbox
from tpunb.provision.gcp.compute import bodies


class Google:
    """What Google's own client sees in the sandbox."""

    def __init__(self, box) -> None:
        kw = {"credentials": AnonymousCredentials(), "client_options": ClientOptions(api_endpoint=box.compute_url)}
        self.project = box.project
        self.instances = compute_v1.InstancesClient(**kw)
        self.migs = compute_v1.InstanceGroupManagersClient(**kw)
        self.templates = compute_v1.RegionInstanceTemplatesClient(**kw)
        self.policies = compute_v1.ResourcePoliciesClient(**kw)

    def everything(self, zone: str) -> dict[str, list[str]]:
        region = catalog.region_of(zone)
        return {"instances": [i.name for i in self.instances.list(project=self.project, zone=zone)],
                "migs": [m.name for m in self.migs.list(project=self.project, zone=zone)],
                "templates": [t.name for t in self.templates.list(project=self.project, region=region)],
                "policies": [p.name for p in self.policies.list(project=self.project, region=region)]}


def sandbox(hosts: int, create_seconds: float, delete_seconds: float, queue_seconds: float) -> Iterator:
    """A module's sandbox (``box``): ``yield from sandbox(...)`` in a module-scoped fixture."""
    box = start_sandbox(hosts=hosts, create_seconds=create_seconds)
    box.emulator.timings(delete_seconds=delete_seconds, queue_seconds=queue_seconds)
    yield box
    box.stop()


@pytest.fixture
def cloud(box, isolated_home, monkeypatch):
    """tpunb pointed at the module's sandbox ``box`` (both APIs), a project configured; afterwards
    no slice is attached and no fault is left on."""
    monkeypatch.setenv("TPUNB_TPU_API_ENDPOINT", box.url)
    monkeypatch.setenv("TPUNB_COMPUTE_API_ENDPOINT", box.compute_url)
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", box.project)
    yield box
    manager.detach_all()
    box.emulator.faults(no_capacity=False, quota=None)


def made(google: Google, name: str, accelerator: str, zone: str, mig: bool = True) -> None:
    """What a tpunb launch makes (its own request bodies), as a kernel that then died left it."""
    vm = bodies.VmSpec(name, apis.compute_shape(accelerator), zone, "someone@example.com", "tpunb",
                       "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGx0 someone", False)
    region, p = catalog.region_of(zone), google.project
    if not vm.shape.multi_host:
        google.instances.insert_unary(project=p, zone=zone, instance_resource=bodies.instance(vm))
        return
    google.policies.insert_unary(project=p, region=region, resource_policy_resource=bodies.workload_policy(vm))
    google.templates.insert_unary(project=p, region=region, instance_template_resource=bodies.template(vm))
    if mig:
        google.migs.insert_unary(project=p, zone=zone, instance_group_manager_resource=bodies.mig(vm, p))
