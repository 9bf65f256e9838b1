"""The sandbox's Compute Engine resources and their JSON, as compute v1 spells them.

Plain data: compute.py decides when fields change. camelCase names, enums as names, int64 (ids,
sizes, seconds) as strings, links as full ``https://www.googleapis.com/compute/v1/`` URLs, as the
real API answers (tests parse every answer with google-cloud-compute's own messages)."""
from __future__ import annotations

import itertools
import re
import secrets
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from collections.abc import Callable
from typing import Any, Protocol

from tpunb.sandbox.compute.compute_checks import invalid
from tpunb.sandbox.hosts.pool import Endpoint, HostPool

BASE = "https://www.googleapis.com/compute/v1/"
_IDS = itertools.count(int(time.time()) * 1000 % 10**15 + 10**15)
_REF = re.compile(r"^(?:https://(?:www|compute)\.googleapis\.com/compute/v1/)?"
                  r"(?:projects/(?P<project>[^/]+)/)?(?P<scope>(?:zones|regions)/[^/]+|global)/(?P<kind>[A-Za-z]+)/(?P<name>[^/]+)$")


class Core(Protocol):
    """What the Compute Engine side uses of the emulator (state.Emulator): its clock, lock, timings,
    faults, host pool and VM logins."""

    hosts: HostPool
    timings: Any
    faults: Any
    _lock: Any

    def at(self, delay: float, fn: Callable[..., None], *args: Any) -> None: ...

    def advance(self) -> None: ...

    def sync_vm_logins(self, owner: str, vm: Vm) -> None: ...


def timestamp() -> str:
    return datetime.now(timezone.utc).astimezone().isoformat(timespec="milliseconds")


def new_id() -> str:
    return str(next(_IDS))


def link(path: str) -> str:
    return BASE + path


def ref(value: Any, project: str, kind: str, field_name: str) -> str:
    """A full or partial URL of a ``kind`` resource as ``projects/P/.../kind/NAME``; a bare name is
    refused as Compute Engine refuses it (field reports: ``The URL is malformed``)."""
    m = _REF.match(value) if isinstance(value, str) else None
    if m is None or m["kind"] != kind:
        raise invalid(f"Invalid value for field '{field_name}': {value!r}. The URL is malformed.")
    return f"projects/{m['project'] or project}/{m['scope']}/{kind}/{m['name']}"


def short(url_or_path: str) -> str:
    """The last part of a URL or path (a machine type's or a zone's name)."""
    return str(url_or_path).rstrip("/").rsplit("/", 1)[-1]


@dataclass
class ComputeOperation:
    """A compute v1 Operation: zonal, regional or global, RUNNING until ``finish``."""

    project: str
    scope: str  # "zones/Z", "regions/R" or "global"
    operation_type: str
    target: str  # the target's path
    target_id: str
    name: str = field(default_factory=lambda: f"operation-{int(time.time() * 1000)}-{secrets.token_hex(6)}")
    id: str = field(default_factory=new_id)
    insert_time: str = field(default_factory=timestamp)
    status: str = "RUNNING"
    error: dict | None = None
    http_error: tuple[int, str] | None = None
    end_time: str | None = None

    @property
    def path(self) -> str:
        return f"projects/{self.project}/{self.scope}/operations/{self.name}"

    @property
    def done(self) -> bool:
        return self.status == "DONE"

    def finish(self, error: dict | None = None, http_error: tuple[int, str] | None = None) -> None:
        if not self.done:
            self.status, self.error, self.http_error, self.end_time = "DONE", error, http_error, timestamp()

    def to_json(self) -> dict:
        out: dict[str, Any] = {
            "kind": "compute#operation", "id": self.id, "name": self.name, "operationType": self.operation_type,
            "targetLink": link(self.target), "targetId": self.target_id, "status": self.status,
            "user": "user@sandbox", "progress": 100 if self.done else 0, "insertTime": self.insert_time,
            "startTime": self.insert_time, "selfLink": link(self.path),
        }
        if self.scope != "global":
            out[self.scope.split("/")[0][:-1]] = link(f"projects/{self.project}/{self.scope}")
        if self.end_time:
            out["endTime"] = self.end_time
        if self.error:
            out["error"] = self.error
        if self.http_error:
            out["httpErrorStatusCode"], out["httpErrorMessage"] = self.http_error
        return out


@dataclass
class Stored:
    """A template or a resource policy: kept as asked, plus what the server adds."""

    path: str
    body: dict
    kind: str  # "compute#instanceTemplate", "compute#resourcePolicy"
    id: str = field(default_factory=new_id)
    created: str = field(default_factory=timestamp)

    def to_json(self) -> dict:
        out = {**self.body, "kind": self.kind, "id": self.id, "creationTimestamp": self.created,
               "selfLink": link(self.path)}
        scope = self.path.split("/")[2]
        if scope == "regions":
            out["region"] = link("/".join(self.path.split("/")[:4]))
        if self.kind == "compute#resourcePolicy":
            out["status"] = "READY"
        return out


@dataclass
class Vm:
    """One instance: alone, or one of a MIG's (``mig``, ``worker``)."""

    project: str
    zone: str
    name: str
    machine_type: str
    properties: dict  # the Instance body (or the template's properties for a MIG's)
    mig: str = ""  # the MIG's path
    worker: int = 0
    endpoint: Endpoint | None = None
    status: str = "PROVISIONING"
    current_action: str = "CREATING"
    id: str = field(default_factory=new_id)
    created: str = field(default_factory=timestamp)
    guest_attributes: dict[str, str] = field(default_factory=dict)
    noticed: bool = False  # its preemption notice has come (metadata instance/preempted is TRUE)
    host_key: str | None = None  # the public line of its sshd's host key (published as guest attributes)

    @property
    def path(self) -> str:
        return f"projects/{self.project}/zones/{self.zone}/instances/{self.name}"

    @property
    def metadata(self) -> dict[str, str]:
        items = (self.properties.get("metadata") or {}).get("items") or []
        own = {str(i.get("key")): str(i.get("value", "")) for i in items}
        return {**own, "created-by": self.mig} if self.mig else own

    @property
    def fingerprint(self) -> str:
        """The metadata's fingerprint: setMetadata must send the one it read (optimistic locking)."""
        import hashlib

        return hashlib.sha256(repr(sorted(self.metadata.items())).encode()).hexdigest()[:16]

    def to_json(self, ssh_port: int = 22) -> dict:
        """The instance as instances.get answers; ``ssh_port``: the sandbox's sshd, when not 22, in
        the label ``tpunb-ssh-port`` (as the Cloud TPU side's nodes carry it)."""
        p = self.properties
        nics = []
        for i, nic in enumerate(p.get("networkInterfaces") or [{}]):
            network = str(nic.get("network") or "global/networks/default")
            owner = network.split("/")[1] if network.startswith("projects/") else self.project
            out = {**nic, "kind": "compute#networkInterface", "name": f"nic{i}",
                   "network": link(f"projects/{owner}/global/networks/{short(network)}")}
            if nic.get("subnetwork"):
                subnet = str(nic["subnetwork"])
                out["subnetwork"] = link(subnet if subnet.startswith("projects/") else f"projects/{owner}/{subnet}")
            if self.endpoint is not None:
                out["networkIP"] = self.endpoint.internal_ip
                if nic.get("accessConfigs"):
                    out["accessConfigs"] = [{**a, "kind": "compute#accessConfig", "natIP": self.endpoint.internal_ip}
                                            for a in nic["accessConfigs"]]
            nics.append(out)
        body: dict[str, Any] = {
            "kind": "compute#instance", "id": self.id, "creationTimestamp": self.created, "name": self.name,
            "machineType": link(f"projects/{self.project}/zones/{self.zone}/machineTypes/{self.machine_type}"),
            "status": self.status, "zone": link(f"projects/{self.project}/zones/{self.zone}"),
            "networkInterfaces": nics, "selfLink": link(self.path),
            "metadata": {"kind": "compute#metadata", "fingerprint": self.fingerprint, **({"items": [
                {"key": k, "value": v} for k, v in self.metadata.items()]} if self.metadata else {})},
        }
        for key in ("description", "labels", "scheduling", "serviceAccounts", "resourcePolicies",
                    "reservationAffinity", "params"):
            if p.get(key):
                body[key] = p[key]
        body["disks"] = [{"kind": "compute#attachedDisk", "type": "PERSISTENT", "mode": "READ_WRITE", "index": i,
                          "deviceName": f"persistent-disk-{i}", "boot": bool(d.get("boot")),
                          "autoDelete": bool(d.get("autoDelete")), "interface": "NVME",
                          "diskSizeGb": str((d.get("initializeParams") or {}).get("diskSizeGb") or 10)}
                         for i, d in enumerate(p.get("disks") or [])]
        body.pop("params", None)  # input only: instances.get does not return it
        if ssh_port != 22:
            body["labels"] = {**body.get("labels", {}), "tpunb-ssh-port": str(ssh_port)}
        return body


@dataclass
class Mig:
    """A zonal managed instance group: its VMs come from ``template``; ``topology`` (from its
    workload policy) makes it a TPU slice, whose VMs are made all at once (BULK).

    While it waits (BULK), it lists every VM it will make (``planned``) by name and URL, with no
    ``instanceStatus`` and no ``id`` (a flex-start one PENDING), and its latest try's errors in
    ``status.bulkInstanceOperation.lastProgressCheck`` and each such member's ``lastAttempt``
    (docs/cloud-facts.md: Compute Engine, MIG status)."""

    project: str
    zone: str
    name: str
    body: dict
    template: str  # the template's path
    policy: str  # the workload policy's path ("" without one)
    topology: str
    target_size: int
    vms: list[str] = field(default_factory=list)  # its instances' paths, in worker order
    waiting: bool = False  # a BULK MIG still waiting for capacity for all its VMs
    deleting: bool = False
    errors: list[dict] = field(default_factory=list)  # what listErrors shows
    planned: list[str] = field(default_factory=list)  # the names of the VMs it will make (listed before they exist)
    bulk_error: dict | None = None  # its latest try's errors (compute v1 Error), while it waits
    checked: str = ""  # when it last tried (lastProgressCheck.timestamp)
    flex: bool = False  # its template is FLEX_START: members waiting for capacity are PENDING
    running_since: float | None = None  # (monotonic) when every VM last became RUNNING: activation starts
    id: str = field(default_factory=new_id)
    created: str = field(default_factory=timestamp)

    @property
    def path(self) -> str:
        return f"projects/{self.project}/zones/{self.zone}/instanceGroupManagers/{self.name}"

    def members(self, vms: list[Vm]) -> list[dict]:
        """listManagedInstances: its VMs, then the ones it will make (a name and a URL, no status, no id)."""
        made = [{"instance": link(v.path), "id": v.id, "name": v.name, "instanceStatus": v.status,
                 "currentAction": v.current_action} for v in vms]
        missing = max(0, self.target_size - len(vms))
        base = f"projects/{self.project}/zones/{self.zone}/instances/"
        coming = [{"instance": link(base + n), "name": n, "currentAction": "CREATING",
                   **({"instanceStatus": "PENDING"} if self.flex else {}),
                   **({"lastAttempt": {"errors": self.bulk_error}} if self.bulk_error else {})}
                  for n in self.planned[:missing]]
        return made + coming

    def to_json(self, vms: list[Vm], topology: tuple[str, dict | None] | None = None) -> dict:
        """``topology``: its applied topology's state and that state's error (compute_migs.py decides)."""
        running = [v for v in vms if v.status == "RUNNING" and v.current_action == "NONE"]
        stable = (not self.waiting and not self.deleting and len(running) == self.target_size == len(vms))
        missing = max(0, self.target_size - len(vms))
        actions = {"creating": (missing if self.waiting else 0) + sum(v.current_action == "CREATING" for v in vms),
                   "recreating": sum(v.current_action == "RECREATING" for v in vms),
                   "deleting": sum(v.current_action == "DELETING" for v in vms), "none": len(running)}
        statuses: dict[str, int] = {"nonExistent": missing} if missing else {}
        for v in vms:
            key = v.status.lower() if v.status != "PENDING" else "pending"
            statuses[key] = statuses.get(key, 0) + 1
        if missing and self.flex:
            statuses["pending"] = statuses.get("pending", 0) + missing
        bulk: dict[str, Any] = {"inProgress": self.waiting or bool(missing)}  # over once every VM exists
        if self.checked:
            bulk["lastProgressCheck"] = {"timestamp": self.checked, **({"error": self.bulk_error} if self.bulk_error
                                                                       else {})}
        status: dict[str, Any] = {"isStable": stable, "currentInstanceStatuses": statuses,
                                  "bulkInstanceOperation": bulk}
        if self.topology and topology is not None:
            state, error = topology
            status["appliedAcceleratorTopologies"] = [{"acceleratorTopology": self.topology, "state": state, **(
                {"stateDetails": {"error": error, "timestamp": timestamp()}} if error else {})}]
        out = {**self.body, "kind": "compute#instanceGroupManager", "id": self.id, "creationTimestamp": self.created,
               "zone": link(f"projects/{self.project}/zones/{self.zone}"), "selfLink": link(self.path),
               "instanceGroup": link(f"projects/{self.project}/zones/{self.zone}/instanceGroups/{self.name}"),
               "instanceTemplate": link(self.template), "targetSize": self.target_size,
               "currentActions": actions, "status": status, "fingerprint": "sandbox"}
        if self.policy:
            out["resourcePolicies"] = {"workloadPolicy": link(self.policy)}
        return out
