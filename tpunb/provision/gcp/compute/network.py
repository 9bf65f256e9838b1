"""Where a Compute Engine slice's VMs sit on the network, and what they can reach from there.

``--network`` and ``--subnetwork`` take a name in the launching project, or a path: a Shared VPC's
``projects/HOST/global/networks/N`` and ``projects/HOST/regions/R/subnetworks/S`` (gcloud's forms;
a global template's subnetwork must be a full path, field reports say). ``--internal-ip`` gives the
VMs no external address, so before anything is made:

- this machine must be in their VPC network (the Cloud TPU path's check: its metadata server says
  which network it is in), or nothing could reach them;
- a Cloud NAT must cover their subnetwork, in a router of its region (``routers.list``), or the VMs
  cannot reach PyPI to be prepared: without one, one warning with the two gcloud commands that
  make one (a refused ``routers.list`` is a notice: it cannot be known), and a preparation that
  then fails for lack of a route says why (``egress_hint``);
- with ``--idle-delete``, the watchdog on worker 0 calls compute.googleapis.com: without NAT that
  needs Private Google Access on the subnetwork (``subnetworks.get``), else one warning with the
  command that turns it on.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from tpunb import catalog, report
from tpunb.errors import ProvisionError, UsageError
from tpunb.provision.gcp import rest
from tpunb.provision.gcp.compute import clients

_API = re.compile(r"^https://(?:www|compute)\.googleapis\.com/compute/v1/")
_NETWORK = re.compile(r"^(?:projects/(?P<project>[^/]+)/)?global/networks/(?P<name>[a-z][-a-z0-9]*)$")
_SUBNETWORK = re.compile(r"^(?:projects/(?P<project>[^/]+)/)?regions/(?P<region>[^/]+)/subnetworks/"
                        r"(?P<name>[a-z][-a-z0-9]*)$")
#: NAT ranges that cover every subnetwork of the router's network in its region
ALL_SUBNETS = ("ALL_SUBNETWORKS_ALL_IP_RANGES", "ALL_SUBNETWORKS_ALL_PRIMARY_IP_RANGES")


def network_path(value: str | None) -> str:
    """``--network`` as the API takes it: ``global/networks/N`` or a Shared VPC's full path."""
    if not value:
        return "global/networks/default"
    value = _API.sub("", value.strip())
    if "/" not in value:
        return f"global/networks/{value}"
    if not _NETWORK.match(value):
        raise UsageError(f"--network {value}: give a network name, or a Shared VPC network as "
                         "projects/HOST_PROJECT/global/networks/NAME")
    return value


def subnetwork_path(value: str, region: str) -> str:
    """``--subnetwork`` as the API takes it, in ``region``: a name, or a (Shared VPC) path there."""
    value = _API.sub("", value.strip())
    if "/" not in value:
        return f"regions/{region}/subnetworks/{value}"
    found = _SUBNETWORK.match(value)
    if not found:
        raise UsageError(f"--subnetwork {value}: give a subnetwork name, or a Shared VPC subnetwork as "
                         "projects/HOST_PROJECT/regions/REGION/subnetworks/NAME")
    if found["region"] != region:
        raise UsageError(f"--subnetwork {value} is in region {found['region']}, the VMs would be in {region}: give "
                         f"--zone in {found['region']}, or a subnetwork of {region}")
    return value


def check_paths(network: str | None, subnetwork: str | None, zones: list[str]) -> list[str]:
    """Both flags' shapes before anything is made (a one-line UsageError), and the zones to try: a
    subnetwork path's region's only."""
    network_path(network)
    found = _SUBNETWORK.match(_API.sub("", subnetwork.strip())) if subnetwork and "/" in subnetwork else None
    if subnetwork and "/" in subnetwork and not found:
        subnetwork_path(subnetwork, "")  # the one line saying what a path looks like
    if found is None:
        return zones
    inside = [z for z in zones if catalog.region_of(z) == found["region"]]
    if not inside:
        raise UsageError(f"--subnetwork {subnetwork} is in region {found['region']}, the VMs would be in "
                         f"{', '.join(sorted({catalog.region_of(z) for z in zones}))}: give --zone in {found['region']}")
    return inside


def choose_subnetwork(project: str, network: str | None, subnetwork: str | None,
                      zones: list[str]) -> tuple[str | None, list[str]]:
    """(--subnetwork, the zones to try): a network other than ``default`` without --subnetwork gets
    its one subnetwork in the first zone's region (a custom-mode network's VMs must name one), and
    only that region's zones; several or none there is a one-line refusal."""
    if subnetwork or not network or _NETWORK.match(network_path(network))["name"] == "default":
        return subnetwork, zones
    owner, name, _ = _where(project, network, None, catalog.region_of(zones[0]))
    region = catalog.region_of(zones[0])
    try:
        found = clients.call(f"list the subnetworks of {region}", lambda: [
            s.name for s in clients.client("SubnetworksClient").list(project=owner, region=region)
            if s.network.rstrip("/").rsplit("/", 1)[-1] == name])
    except ProvisionError:
        return subnetwork, zones  # cannot ask: Compute Engine says what it needs
    if len(found) != 1:
        have = f"subnetworks {', '.join(found)}: give --subnetwork" if found else "no subnetwork there: give --zone " \
            "in a region where it has one, or --subnetwork"
        raise UsageError(f"--network {network} has {have} ({region})")
    path = found[0] if owner == project else f"projects/{owner}/regions/{region}/subnetworks/{found[0]}"
    return path, [z for z in zones if catalog.region_of(z) == region]


@dataclass(frozen=True)
class Egress:
    """What the VMs of a launch with --internal-ip can reach: ``nat`` True (a Cloud NAT covers their
    subnetwork), False (none does), None (not known: routers.list refused)."""

    nat: bool | None
    network: str
    subnetwork: str
    region: str
    project: str  # the network's (a Shared VPC host project's)


def _where(project: str, network: str | None, subnetwork: str | None, region: str) -> tuple[str, str, str]:
    """(the network's project, its name, the subnetwork's name) the VMs would have."""
    net = _NETWORK.match(network_path(network))
    owner, name = net["project"] or project, net["name"]
    if subnetwork:
        sub = _SUBNETWORK.match(subnetwork_path(subnetwork, region))
        return sub["project"] or owner, name, sub["name"]
    return owner, name, name  # an auto-mode network's subnetwork in a region is named after it


def check_internal_ip(project: str, zone: str, network: str | None, subnetwork: str | None,
                      idle: bool = False) -> Egress:
    """--internal-ip on Compute Engine, before anything is made: this machine reaches the VPC (else a
    one-line refusal), then Cloud NAT and, with the idle watchdog, Private Google Access (warnings)."""
    region = catalog.region_of(zone)
    owner, name, sub = _where(project, network, subnetwork, region)
    rest.check_reaches_vpc(name)
    egress = Egress(_nat_covers(owner, region, name, sub), name, sub, region, owner)
    if egress.nat is None:
        report.info(f"[tpunb] --internal-ip: cannot check for a Cloud NAT in {owner}/{region} (routers.list refused): "
                    f"the VMs reach PyPI to be prepared only through one")
    elif not egress.nat:
        report.warn(f"[tpunb] --internal-ip: no Cloud NAT covers subnetwork {sub} of network {name} in {region}, so the "
                    f"VMs cannot reach PyPI to be prepared: `{nat_commands(egress)}`")
    if idle and egress.nat is not True and _private_access(owner, region, sub) is False:
        report.warn(f"[tpunb] --idle-delete with --internal-ip: subnetwork {sub} has no Private Google Access and no "
                    f"Cloud NAT, so the watchdog cannot reach compute.googleapis.com to delete the slice: `gcloud compute "
                    f"networks subnets update {sub} --region {region} --enable-private-ip-google-access --project "
                    f"{owner}`")
    return egress


def nat_commands(egress: Egress) -> str:
    """The two gcloud commands that give the VMs' region a Cloud NAT (Google's Cloud NAT quickstart)."""
    router = f"{egress.network}-nat-router"
    return (f"gcloud compute routers create {router} --network {egress.network} --region {egress.region} --project "
            f"{egress.project}` then `gcloud compute routers nats create {egress.network}-nat --router {router} "
            f"--region {egress.region} --auto-allocate-nat-external-ips --nat-all-subnet-ip-ranges --project "
            f"{egress.project}")


def egress_hint(egress: Egress | None) -> str:
    """What a preparation that found no route to the package index adds, when the launch knew why."""
    if egress is None or egress.nat is not False:
        return ""
    return (f"; the VMs have no external IP (--internal-ip) and no Cloud NAT covers subnetwork {egress.subnetwork} in "
            f"{egress.region}: `{nat_commands(egress)}`, or launch without --internal-ip")


def _nat_covers(project: str, region: str, network: str, subnetwork: str) -> bool | None:
    """Whether a router of ``network`` in ``region`` has a NAT covering ``subnetwork``; None when
    routers.list is refused (or fails)."""
    try:
        routers = clients.call(f"list the routers of {region}", lambda: list(clients.client("RoutersClient").list(
            project=project, region=region)))
    except ProvisionError:
        return None
    for router in routers:
        if router.network.rstrip("/").rsplit("/", 1)[-1] != network:
            continue
        for nat in router.nats:
            if nat.source_subnetwork_ip_ranges_to_nat in ALL_SUBNETS:
                return True
            if any(s.name.rstrip("/").rsplit("/", 1)[-1] == subnetwork for s in nat.subnetworks):
                return True
    return False


def _private_access(project: str, region: str, subnetwork: str) -> bool | None:
    """The subnetwork's privateIpGoogleAccess; None when it cannot be read."""
    from google.api_core import exceptions

    try:
        found = clients.call(f"read subnetwork {subnetwork}", clients.client("SubnetworksClient").get,
                             project=project, region=region, subnetwork=subnetwork)
    except (ProvisionError, exceptions.NotFound):
        return None
    return bool(found.private_ip_google_access)
