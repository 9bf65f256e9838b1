"""Project-wide parts of the sandbox's Compute Engine, which a launch reads but never makes: the VPC
(subnetworks, routers with their Cloud NAT), reservations and the future reservations that deliver
them. Each is set with the Compute Engine faults (``AdminClient.compute_faults``); sources and
what is synthetic are in docs/cloud-facts.md.

- ``subnets``: [{"project", "region", "name", "network", "pga"}] beside the default network's
  (auto mode: a subnetwork ``default`` in every region, without Private Google Access).
- ``routers``: [{"project", "region", "name", "network", "nat": "ALL" | [subnetwork names]}].
  A VM with no external IP and no NAT covering its subnetwork has no way out of the VPC
  (``egress``): the sandbox gives its host an HTTPS proxy that refuses (hosts.configure).
- ``routers_denied`` / ``future_reservations_denied``: those lists answer 403, as to a caller
  without compute.routers.list / compute.futureReservations.list.
- ``reservations``: {name: {"zone", "project" (its owner; default: every project that asks),
  "mode": "CALENDAR" | "DEFAULT", "shared_with": [projects], "name_prefix"}}. A CALENDAR one was
  delivered by a future reservation in calendar mode (listed in futureReservations.aggregatedList,
  by ``reservationName``, or ``namePrefix`` when one is given) and takes only RESERVATION_BOUND VMs
  with instanceTerminationAction DELETE, automaticRestart false and onHostMaintenance TERMINATE.
"""
from __future__ import annotations

import hashlib
from typing import Any

from tpunb import catalog
from tpunb.sandbox.compute.compute_checks import ComputeError, invalid, matches, not_found
from tpunb.sandbox.compute.compute_records import link, ref, short

RESERVATION_KEY = "compute.googleapis.com/reservation-name"
#: the Compute Engine faults this module reads (``reservations`` is compute.py's own list too)
FAULTS = ("subnets", "routers", "routers_denied", "future_reservations_denied")
NAT_ALL = "ALL_SUBNETWORKS_ALL_IP_RANGES"


def _id(*parts: str) -> str:
    return str(int(hashlib.sha256("/".join(parts).encode()).hexdigest()[:12], 16))


# -- the VPC ------------------------------------------------------------------------------------

def subnetworks(faults: dict, project: str, region: str) -> list[dict]:
    """The region's subnetworks: the default network's, then those the ``subnets`` fault adds."""
    own = [s for s in faults.get("subnets") or [] if s.get("project", project) == project and s["region"] == region]
    found = [] if any(s["name"] == "default" for s in own) else [{"name": "default", "network": "default", "pga": False}]
    out = []
    for s in found + own:
        path = f"projects/{project}/regions/{region}/subnetworks/{s['name']}"
        out.append({"kind": "compute#subnetwork", "id": _id(path), "name": s["name"], "selfLink": link(path),
                    "network": link(f"projects/{project}/global/networks/{s.get('network', s['name'])}"),
                    "region": link(f"projects/{project}/regions/{region}"), "ipCidrRange": "10.128.0.0/20",
                    "privateIpGoogleAccess": bool(s.get("pga")), "stackType": "IPV4_ONLY"})
    return out


def list_subnetworks(faults: dict, project: str, region: str, filter: str = "") -> dict:
    items = [s for s in subnetworks(faults, project, region) if matches(s, filter)]
    path = f"projects/{project}/regions/{region}/subnetworks"
    return {"kind": "compute#subnetworkList", "id": path, "selfLink": link(path), **({"items": items} if items else {})}


def get_subnetwork(faults: dict, project: str, region: str, name: str) -> dict:
    for s in subnetworks(faults, project, region):
        if s["name"] == name:
            return s
    raise not_found(f"projects/{project}/regions/{region}/subnetworks/{name}")


def list_routers(faults: dict, project: str, region: str, filter: str = "") -> dict:
    if faults.get("routers_denied"):
        raise ComputeError(403, "forbidden", f"Required 'compute.routers.list' permission for 'projects/{project}'")
    items = []
    for r in faults.get("routers") or []:
        if r.get("project", project) != project or r["region"] != region:
            continue
        path = f"projects/{project}/regions/{region}/routers/{r['name']}"
        router: dict[str, Any] = {"kind": "compute#router", "id": _id(path), "name": r["name"], "selfLink": link(path),
                                  "network": link(f"projects/{project}/global/networks/{r.get('network', 'default')}"),
                                  "region": link(f"projects/{project}/regions/{region}")}
        nat = r.get("nat")
        if nat == "ALL":
            router["nats"] = [{"name": f"{r['name']}-nat", "sourceSubnetworkIpRangesToNat": NAT_ALL,
                               "natIpAllocateOption": "AUTO_ONLY"}]
        elif nat:
            router["nats"] = [{"name": f"{r['name']}-nat", "sourceSubnetworkIpRangesToNat": "LIST_OF_SUBNETWORKS",
                               "natIpAllocateOption": "AUTO_ONLY", "subnetworks": [
                                   {"name": link(f"projects/{project}/regions/{region}/subnetworks/{s}"),
                                    "sourceIpRangesToNat": ["ALL_IP_RANGES"]} for s in nat]}]
        if matches(router, filter):
            items.append(router)
    path = f"projects/{project}/regions/{region}/routers"
    return {"kind": "compute#routerList", "id": path, "selfLink": link(path), **({"items": items} if items else {})}


def check_nic(faults: dict, project: str, region: str, nic: dict) -> None:
    """A network interface's network and subnetwork as Compute Engine takes them: a name's path or a
    full one (a Shared VPC's, in its host project), an existing subnetwork of the VMs' region, and a
    subnetwork named for a custom-mode network (every network here but ``default``)."""
    network = ref(nic.get("network") or "global/networks/default", project, "networks",
                  "resource.networkInterfaces[0].network")
    owner, name = network.split("/")[1], short(network)
    subnet = nic.get("subnetwork")
    if not subnet:
        if name != "default":
            raise invalid("Invalid value for field 'resource.networkInterfaces[0].subnetwork': ''. Subnetwork should "
                          "be specified for custom subnetmode network")
        return
    path = ref(subnet, owner, "subnetworks", "resource.networkInterfaces[0].subnetwork")
    if path.split("/")[3] != region:
        raise invalid(f"Invalid value for field 'resource.networkInterfaces[0].subnetwork': '{subnet}'. Subnetwork "
                      f"must be in region {region}.")
    found = [s for s in subnetworks(faults, path.split("/")[1], region) if s["name"] == short(path)]
    if not found:
        raise invalid(f"Invalid value for field 'resource.networkInterfaces[0].subnetwork': '{subnet}'. The "
                      f"resource '{path}' was not found")
    if short(found[0]["network"]) != name:
        raise invalid(f"Invalid value for field 'resource.networkInterfaces[0].subnetwork': '{subnet}'. Subnetwork "
                      f"belongs to network {short(found[0]['network'])}, not {name}.")


def egress(faults: dict, project: str, zone: str, nic: dict) -> bool:
    """Whether a VM with network interface ``nic`` reaches the internet: an external address, or a
    Cloud NAT of its network covering its subnetwork in its region."""
    if nic.get("accessConfigs"):
        return True
    region = catalog.region_of(zone)
    network = short(nic.get("network") or "default")
    subnet = short(nic.get("subnetwork") or network)
    owner = _owner(nic.get("subnetwork") or nic.get("network") or "", project)
    for r in faults.get("routers") or []:
        if r.get("project", owner) != owner or r["region"] != region or r.get("network", "default") != network:
            continue
        if r.get("nat") == "ALL" or subnet in (r.get("nat") or []):
            return True
    return False


def _owner(path: str, project: str) -> str:
    parts = str(path).split("/")
    return parts[parts.index("projects") + 1] if "projects" in parts else project


# -- reservations ---------------------------------------------------------------------------------

def _reservations(faults: dict, project: str) -> dict[str, dict]:
    """The reservations ``project`` owns (one the fault names without a ``project`` belongs to any)."""
    return {name: r for name, r in (faults.get("reservations") or {}).items() if r.get("project", project) == project}


def aggregated_reservations(faults: dict, project: str, filter: str = "") -> dict:
    items: dict[str, dict] = {}
    for name, r in _reservations(faults, project).items():
        path = f"projects/{project}/zones/{r['zone']}/reservations/{name}"
        body = {"kind": "compute#reservation", "id": _id(path), "name": name, "selfLink": link(path),
                "zone": link(f"projects/{project}/zones/{r['zone']}"), "status": "READY",
                "specificReservationRequired": True,
                "shareSettings": ({"shareType": "SPECIFIC_PROJECTS", "projectMap": {
                    p: {"projectId": p} for p in r["shared_with"]}} if r.get("shared_with") else {"shareType": "LOCAL"})}
        if matches(body, filter):
            items.setdefault(f"zones/{r['zone']}", {"reservations": []})["reservations"].append(body)
    path = f"projects/{project}/aggregated/reservations"
    return {"kind": "compute#reservationAggregatedList", "id": path, "items": items, "selfLink": link(path)}


def aggregated_future_reservations(faults: dict, project: str, filter: str = "") -> dict:
    """The future reservations that delivered the CALENDAR reservations (a DEFAULT one has none here)."""
    if faults.get("future_reservations_denied"):
        raise ComputeError(403, "forbidden", f"Required 'compute.futureReservations.list' permission for "
                                             f"'projects/{project}'")
    items: dict[str, dict] = {}
    for name, r in _reservations(faults, project).items():
        if r.get("mode", "DEFAULT") != "CALENDAR":
            continue
        path = f"projects/{project}/zones/{r['zone']}/futureReservations/fr-{name}"
        body = {"kind": "compute#futureReservation", "id": _id(path), "name": f"fr-{name}", "selfLink": link(path),
                "zone": link(f"projects/{project}/zones/{r['zone']}"), "reservationMode": "CALENDAR",
                **({"namePrefix": r["name_prefix"]} if r.get("name_prefix") else {"reservationName": name})}
        if matches(body, filter):
            items.setdefault(f"zones/{r['zone']}", {"futureReservations": []})["futureReservations"].append(body)
    path = f"projects/{project}/aggregated/futureReservations"
    return {"kind": "compute#futureReservationsAggregatedListResponse", "id": path, "items": items,
            "selfLink": link(path)}


def check_consumption(faults: dict, project: str, zone: str, properties: dict) -> None:
    """A VM (or a template's VMs) that names a specific reservation: it exists in its owner's project,
    in this zone, is shared with this project, and the VM's scheduling is what it takes."""
    affinity = properties.get("reservationAffinity") or {}
    if affinity.get("consumeReservationType") != "SPECIFIC_RESERVATION":
        return
    values = [str(v) for v in affinity.get("values") or []]
    if affinity.get("key") != RESERVATION_KEY or not values:
        raise invalid(f"Invalid value for field 'resource.reservationAffinity': a specific reservation is named with "
                      f"key {RESERVATION_KEY} and its name in values.")
    owner, name = (values[0].split("/")[1], short(values[0])) if values[0].startswith("projects/") else (project, values[0])
    found = _reservations(faults, owner).get(name)
    if found is None:
        raise invalid(f"Invalid value for field 'resource.reservationAffinity.values[0]': '{values[0]}'. The "
                      f"reservation does not exist in project {owner}.")
    if owner != project and project not in (found.get("shared_with") or []):
        raise ComputeError(403, "forbidden", f"Reservation '{values[0]}' is not shared with project {project}.")
    if found["zone"] != zone and short(zone) != found["zone"]:
        raise invalid(f"Invalid value for field 'resource.reservationAffinity.values[0]': '{values[0]}'. The "
                      f"reservation is in zone {found['zone']}, not {zone}.")
    scheduling = properties.get("scheduling") or {}
    model = scheduling.get("provisioningModel", "STANDARD")
    if model == "SPOT":
        raise invalid("Invalid value for field 'resource.scheduling.provisioningModel': 'SPOT'. Spot VMs cannot "
                      "consume a reservation.")
    calendar = found.get("mode", "DEFAULT") == "CALENDAR"
    if calendar and model != "RESERVATION_BOUND":
        raise invalid(f"Invalid value for field 'resource.scheduling.provisioningModel': '{model}'. Reservation {name} "
                      "was delivered by a future reservation in calendar mode: its VMs must use provisioning model "
                      "RESERVATION_BOUND.")
    if not calendar and model == "RESERVATION_BOUND":
        raise invalid(f"Invalid value for field 'resource.scheduling.provisioningModel': 'RESERVATION_BOUND'. "
                      f"Reservation {name} was not delivered by a future reservation in calendar mode.")
    if model == "RESERVATION_BOUND":
        wanted = {"instanceTerminationAction": "DELETE", "automaticRestart": False, "onHostMaintenance": "TERMINATE"}
        for key, value in wanted.items():
            if scheduling.get(key, None if key != "automaticRestart" else True) != value:
                raise invalid(f"Invalid value for field 'resource.scheduling.{key}': "
                              f"'{scheduling.get(key, '')}'. RESERVATION_BOUND VMs of a TPU reservation need "
                              f"{key} {str(value).lower() if isinstance(value, bool) else value}.")
