"""HTTP routes of the sandbox's Compute Engine API (what google-cloud-compute's REST transport
calls; every path starts with /compute/v1/projects/P/):

  zones/Z/instances[/I]                   GET list (filter) | POST insert | GET | DELETE
  zones/Z/instances/I/getGuestAttributes  GET (queryPath | variableKey)
  zones/Z/instances/I/setMetadata         POST (the fingerprint read, the items)
  aggregated/instances                    GET (filter)
  aggregated/instanceGroupManagers|instanceTemplates|resourcePolicies   GET (filter)
  global|regions/R/instanceTemplates[/T]  GET list | POST insert | GET | DELETE
  regions/R/resourcePolicies[/P]          GET list | POST insert | GET | DELETE
  zones/Z/instanceGroupManagers[/M]       GET list | POST insert | GET | DELETE
     .../M/listManagedInstances (POST), listErrors (GET), resize?size=N (POST), resizeRequests (POST)
  zones/Z|regions/R|global operations/O   GET | POST .../wait
  zones/Z/machineTypes[/MT], aggregated/machineTypes   the TPU machine types (tpunb's catalog)
  regions/R/routers, regions/R/subnetworks[/S]          GET: the VPC a launch reads (compute_project.py)
  aggregated/reservations|futureReservations            GET (filter): reservations and calendar-mode deliveries
(``GET /compute/v1/projects/P``, the project's metadata, is server.py's.)"""
from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tpunb.sandbox.compute import machines
from tpunb.sandbox.compute import compute_project
from tpunb.sandbox.compute.machines import compute_zones, machine_types_in
from tpunb.sandbox.compute.compute_checks import ComputeError, not_found
from tpunb.sandbox.compute.compute_records import link

if TYPE_CHECKING:
    from tpunb.sandbox.iam.accounts import Accounts
    from tpunb.sandbox.compute.compute import ComputeEngine

PREFIX = re.compile(r"^/compute/v1/projects/(?P<project>[^/]+)/(?P<rest>.+)$")
_SCOPE = r"(?P<scope>zones/[^/]+|regions/[^/]+|global)"
_ZONE = r"zones/(?P<zone>[^/]+)"
#: vCPUs and memory (MiB) per machine type, from Compute Engine's tpu-machines table
SIZES = {"tpu7x-standard-4t": (224, 983040), "ct6e-standard-1t": (44, 180224), "ct6e-standard-4t": (180, 737280),
         "ct6e-standard-8t": (360, 1474560), "ct5p-hightpu-4t": (208, 458752)}
MACHINE_TYPE_IDS = {name: str(1_000_000 + i) for i, name in enumerate(SIZES)}


def _routes(ce: ComputeEngine, p: str, q: dict[str, str], body: dict) -> list[tuple[str, str, Callable[..., Any]]]:
    f = q.get("filter", "")
    return [
        ("GET", _ZONE + r"/instances", lambda zone: ce.list_instances(p, zone, f)),
        ("POST", _ZONE + r"/instances", lambda zone: ce.insert_instance(p, zone, body)),
        ("GET", _ZONE + r"/instances/(?P<i>[^/]+)", lambda zone, i: ce.get_instance(p, zone, i)),
        ("DELETE", _ZONE + r"/instances/(?P<i>[^/]+)", lambda zone, i: ce.delete_instance(p, zone, i)),
        ("POST", _ZONE + r"/instances/(?P<i>[^/]+)/setMetadata", lambda zone, i: ce.set_metadata(p, zone, i, body)),
        ("GET", _ZONE + r"/instances/(?P<i>[^/]+)/getGuestAttributes",
         lambda zone, i: ce.guest_attributes(p, zone, i, q.get("queryPath", ""), q.get("variableKey", ""))),
        ("GET", r"aggregated/instances", lambda: ce.aggregated_instances(p, f)),
        ("GET", _ZONE + r"/instanceGroupManagers", lambda zone: ce.list_migs(p, zone, f)),
        ("GET", r"aggregated/(?P<kind>instanceGroupManagers|instanceTemplates|resourcePolicies)",
         lambda kind: ce.aggregated(p, kind, f)),
        ("POST", _ZONE + r"/instanceGroupManagers", lambda zone: ce.insert_mig(p, zone, body)),
        ("GET", _ZONE + r"/instanceGroupManagers/(?P<m>[^/]+)", lambda zone, m: ce.get_mig(p, zone, m)),
        ("DELETE", _ZONE + r"/instanceGroupManagers/(?P<m>[^/]+)", lambda zone, m: ce.delete_mig(p, zone, m)),
        ("POST", _ZONE + r"/instanceGroupManagers/(?P<m>[^/]+)/listManagedInstances",
         lambda zone, m: ce.list_managed_instances(p, zone, m)),
        ("GET", _ZONE + r"/instanceGroupManagers/(?P<m>[^/]+)/listErrors", lambda zone, m: ce.list_errors(p, zone, m)),
        ("POST", _ZONE + r"/instanceGroupManagers/(?P<m>[^/]+)/resize",
         lambda zone, m: ce.resize_mig(p, zone, m, q.get("size", ""))),
        ("POST", _ZONE + r"/instanceGroupManagers/(?P<m>[^/]+)/resizeRequests",
         lambda zone, m: ce.insert_resize_request(p, zone, m, body)),
        ("GET", _SCOPE + r"/operations/(?P<o>[^/]+)", lambda scope, o: ce.get_operation(p, scope, o)),
        ("POST", _SCOPE + r"/operations/(?P<o>[^/]+)/wait", lambda scope, o: ce.wait_operation(p, scope, o)),
        ("GET", _ZONE + r"/machineTypes", lambda zone: machine_type_list(ce, p, zone)),
        ("GET", _ZONE + r"/machineTypes/(?P<mt>[^/]+)", lambda zone, mt: machine_type_get(ce, p, zone, mt)),
        ("GET", r"aggregated/machineTypes", lambda: machine_types_aggregated(p, f, ce.faults.get("hidden_types"))),
        ("GET", r"regions/(?P<r>[^/]+)/routers", lambda r: compute_project.list_routers(ce.faults, p, r, f)),
        ("GET", r"regions/(?P<r>[^/]+)/subnetworks", lambda r: compute_project.list_subnetworks(ce.faults, p, r, f)),
        ("GET", r"regions/(?P<r>[^/]+)/subnetworks/(?P<s>[^/]+)",
         lambda r, s: compute_project.get_subnetwork(ce.faults, p, r, s)),
        ("GET", r"aggregated/reservations", lambda: compute_project.aggregated_reservations(ce.faults, p, f)),
        ("GET", r"aggregated/futureReservations",
         lambda: compute_project.aggregated_future_reservations(ce.faults, p, f)),
    ]


_STORED = re.compile(r"^(?P<scope>(?:regions/[^/]+|global))/(?P<kind>instanceTemplates|resourcePolicies)"
                     r"(?:/(?P<name>[^/]+))?$")


_VERBS = {"GET": "get", "POST": "create", "DELETE": "delete"}
_ACTIONS = {"listManagedInstances": "get", "listErrors": "get", "resize": "update", "resizeRequests": "update",
            "getGuestAttributes": "getGuestAttributes", "wait": "get", "setMetadata": "setMetadata"}


def permission(method: str, rest: str) -> str:
    """The IAM permission a call needs, as Compute Engine names it (``compute.instances.create``,
    ``compute.zoneOperations.get``...): the collection's, the verb's or the custom method's."""
    parts = rest.split("/")
    if parts[0] == "aggregated":
        return f"compute.{parts[1]}.list"
    at = 1 if parts[0] == "global" else 2
    kind = parts[at] if len(parts) > at else ""
    if kind == "operations":
        return f"compute.{'global' if at == 1 else parts[0][:-1]}Operations.get"
    if len(parts) == at + 1:
        return f"compute.{kind}.{'list' if method == 'GET' else 'create'}"
    verb = _ACTIONS.get(parts[at + 2], "get") if len(parts) > at + 2 else _VERBS.get(method, "get")
    return f"compute.{kind}.{verb}"


def dispatch(ce: ComputeEngine, method: str, path: str, query: dict[str, str], body: dict, caller: str = "",
             accounts: Accounts | None = None) -> Any:
    """Answer one Compute Engine call, under the emulator's lock (operations.wait lets go of it while
    it waits), once ``caller`` holds its permission (``accounts``: who holds what)."""
    m = PREFIX.match(path)
    if m is None:
        raise not_found(path)
    project, rest = m["project"], m["rest"]
    needed = permission(method, rest)
    if accounts is not None and not accounts.allowed(caller, needed):
        raise ComputeError(403, "forbidden", f"Required '{needed}' permission for 'projects/{project}/{rest}'")
    stored = _STORED.match(rest)
    if stored is not None and (stored["kind"] == "instanceTemplates" or stored["scope"] != "global"):
        return _stored(ce, method, project, stored["scope"], stored["kind"], stored["name"], body, query)
    for verb, pattern, handler in _routes(ce, project, query, body):
        found = re.fullmatch(pattern, rest)
        if found and verb == method:
            return handler(**{k: v for k, v in found.groupdict().items() if v is not None})
    raise ComputeError(404, "notFound", f"The sandbox's Compute Engine API does not serve {method} {path}")


def _stored(ce: ComputeEngine, method: str, project: str, scope: str, kind: str, name: str | None,
            body: dict, query: dict[str, str]) -> Any:
    if name is None and method == "GET":
        return ce.list_stored(project, scope, kind, query.get("filter", ""))
    if name is None and method == "POST":
        return ce.insert_stored(project, scope, kind, body)
    if name is not None and method == "GET":
        return ce.get_stored(project, scope, kind, name)
    if name is not None and method == "DELETE":
        return ce.delete_stored(project, scope, kind, name)
    raise ComputeError(405, "methodNotAllowed", f"{method} is not served on {kind}")


def _machine_type_json(project: str, zone: str, machine: machines.MachineType) -> dict:
    cpus, memory = SIZES[machine.name]
    path = f"projects/{project}/zones/{zone}/machineTypes/{machine.name}"
    return {"kind": "compute#machineType", "id": MACHINE_TYPE_IDS[machine.name], "name": machine.name,
            "creationTimestamp": "2025-01-01T00:00:00.000-08:00", "guestCpus": cpus, "memoryMb": memory,
            "description": f"{cpus} vCPUs, {memory // 1024} GB RAM, {machine.chips} TPU chips",
            "zone": zone, "selfLink": link(path), "isSharedCpu": False, "maximumPersistentDisks": 128,
            "maximumPersistentDisksSizeGb": "263168", "architecture": "X86_64"}


def machine_type_list(ce: ComputeEngine, project: str, zone: str) -> dict:
    ce.check_zone(project, zone)
    items = [_machine_type_json(project, zone, m) for m in machine_types_in(zone)]
    path = f"projects/{project}/zones/{zone}/machineTypes"
    return {"kind": "compute#machineTypeList", "id": path, "selfLink": link(path), **({"items": items} if items else {})}


def machine_type_get(ce: ComputeEngine, project: str, zone: str, name: str) -> dict:
    ce.check_zone(project, zone)
    found = [m for m in machine_types_in(zone) if m.name == name]
    if not found:
        raise not_found(f"projects/{project}/zones/{zone}/machineTypes/{name}")
    return _machine_type_json(project, zone, found[0])


def machine_types_aggregated(project: str, filter: str = "", hidden: list[str] | None = None) -> dict:
    """machineTypes.aggregatedList: the TPU machine types of every zone (``filter`` as ``name = X``);
    ``hidden``: types this project does not see (the ``hidden_types`` fault: TPU7x for a project off
    Google's allowlist, unverified: the harsher reading)."""
    wanted = re.search(r"name\s*(?:=|eq)\s*\"?([\w-]+)\"?", filter or "")
    items = {}
    for zone in compute_zones():
        found = [_machine_type_json(project, zone, m) for m in machine_types_in(zone)
                 if (wanted is None or m.name == wanted[1]) and m.name not in (hidden or ())]
        if found:
            items[f"zones/{zone}"] = {"machineTypes": found}
    path = f"projects/{project}/aggregated/machineTypes"
    return {"kind": "compute#machineTypeAggregatedList", "id": path, "items": items, "selfLink": link(path)}
