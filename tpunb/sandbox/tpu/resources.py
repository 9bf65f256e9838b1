"""The emulator's records and their JSON shapes, exactly as the Cloud TPU v2 REST API spells them.

Everything here is plain data: the state machine (state.py) decides when fields change, the
HTTP layer (server.py) only serialises what ``to_json`` returns. Field names are camelCase,
enums are names ("READY"), int64 ids are strings and default values are left out, as the
real API does, so the official client parses these bodies without knowing it is talking to us.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from tpunb.sandbox.hosts.pool import Endpoint

TYPE_PREFIX = "type.googleapis.com/google.cloud.tpu.v2."
EMPTY_TYPE = "type.googleapis.com/google.protobuf.Empty"
ERROR_INFO_TYPE = "type.googleapis.com/google.rpc.ErrorInfo"
SSH_PORT_LABEL = "tpunb-ssh-port"
TPU_SERVICE_PORT = 8470  # what the real API reports in networkEndpoints[].port

# AcceleratorConfig.Type names per catalog generation (tpu_v2 has no enum for newer ones)
ACCELERATOR_CONFIG_TYPES = {
    "v2": "V2",
    "v3": "V3",
    "v4": "V4",
    "v5e": "V5LITE_POD",
    "v5p": "V5P",
    "v6e": "V6E",
}


class ApiError(Exception):
    """An error the API answers with: HTTP status, google.rpc status name and message."""

    def __init__(self, http: int, status: str, message: str, details: list[dict] | None = None) -> None:
        super().__init__(message)
        self.http = http
        self.status = status
        self.message = message
        self.details = details or []

    def body(self) -> dict:
        error: dict[str, Any] = {"code": self.http, "message": self.message, "status": self.status}
        if self.details:  # as the real API: no empty list (proto3 JSON leaves defaults out)
            error["details"] = self.details
        return {"error": error}


def now_rfc3339() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def eid() -> str:
    """The ``[EID: 0x...]`` tag real TPU error messages end with."""
    return f"[EID: 0x{secrets.token_hex(8)}]"


def error_info(reason: str, domain: str, **metadata: str) -> dict:
    return {"@type": ERROR_INFO_TYPE, "reason": reason, "domain": domain, "metadata": metadata}


@dataclass
class Operation:
    """A long-running operation: done with a ``response`` or an ``error`` (google.rpc.Status)."""

    name: str
    verb: str
    target: str
    create_time: str = field(default_factory=now_rfc3339)
    done: bool = False
    response: dict | None = None
    error: dict | None = None
    end_time: str | None = None

    def finish(self, response: dict | None = None, error: dict | None = None) -> None:
        if self.done:
            return
        self.done, self.response, self.error, self.end_time = True, response, error, now_rfc3339()

    def to_json(self) -> dict:
        meta: dict[str, Any] = {
            "@type": TYPE_PREFIX + "OperationMetadata",
            "createTime": self.create_time,
            "target": self.target,
            "verb": self.verb,
            "apiVersion": "v2",
        }
        if self.end_time:
            meta["endTime"] = self.end_time
        out: dict[str, Any] = {"name": self.name, "metadata": meta}
        if self.done:  # proto3 JSON leaves a false bool out, as the real API does
            out["done"] = True
        if self.error is not None:
            out["error"] = self.error
        elif self.response is not None:
            out["response"] = self.response
        return out


@dataclass
class Node:
    """One TPU node (a slice); ``request`` keeps the create body's fields we do not model."""

    project: str
    zone: str
    node_id: str
    accelerator: str
    generation: str
    topology: str
    hosts: int
    runtime: str
    request: dict
    spot: bool = False
    preemptible: bool = False
    external_ips: bool = False
    labels: dict[str, str] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)
    guest_attributes: dict[int, dict[str, str]] = field(default_factory=dict)  # worker -> "ns/key" -> value
    state: str = "CREATING"
    health: str | None = None
    endpoints: list[Endpoint] = field(default_factory=list)
    endpoints_visible: bool = False
    queued_resource: str | None = None
    multislice: bool = False  # one of a multislice's nodes (Node.multisliceNode, output only)
    create_op: Operation | None = None
    delete_op: Operation | None = None
    numeric_id: int = field(default_factory=lambda: secrets.randbelow(8 * 10**18) + 10**18)  # int64
    create_time: str = field(default_factory=now_rfc3339)

    @property
    def name(self) -> str:
        return f"projects/{self.project}/locations/{self.zone}/nodes/{self.node_id}"

    def to_json(self, ssh_port: int = 22) -> dict:
        region = self.zone.rsplit("-", 1)[0]
        labels = dict(self.labels)
        if ssh_port != 22:
            labels[SSH_PORT_LABEL] = str(ssh_port)
        out: dict[str, Any] = {
            "name": self.name,
            "acceleratorType": self.accelerator,
            "state": self.state,
            "runtimeVersion": self.runtime,
            "networkConfig": {
                "network": f"projects/{self.project}/global/networks/default",
                "subnetwork": f"projects/{self.project}/regions/{region}/subnetworks/default",
                **self.request.get("networkConfig", {}),
            },
            "cidrBlock": "10.130.0.0/20",
            "serviceAccount": self.request.get("serviceAccount")
            or {"email": "default", "scope": ["https://www.googleapis.com/auth/cloud-platform"]},
            "createTime": self.create_time,
            "id": str(self.numeric_id),
            "apiVersion": "V2",
        }
        sched = {k: True for k, on in (("spot", self.spot), ("preemptible", self.preemptible)) if on}
        if sched:
            out["schedulingConfig"] = sched
        if self.endpoints_visible:
            out["networkEndpoints"] = [_endpoint_json(e) for e in self.endpoints]
        if self.health:
            out["health"] = self.health
        for key in ("description", "tags", "dataDisks", "shieldedInstanceConfig"):
            if self.request.get(key):
                out[key] = self.request[key]
        if labels:
            out["labels"] = labels
        if self.metadata:
            out["metadata"] = dict(self.metadata)
        if self.generation in ACCELERATOR_CONFIG_TYPES:
            out["acceleratorConfig"] = {
                "type": ACCELERATOR_CONFIG_TYPES[self.generation],
                "topology": self.topology,
            }
        if self.queued_resource:
            out["queuedResource"] = self.queued_resource
        if self.multislice:
            out["multisliceNode"] = True
        return out


def _endpoint_json(e: Endpoint) -> dict:
    out: dict[str, Any] = {"ipAddress": e.internal_ip, "port": TPU_SERVICE_PORT}
    if e.external_ip:
        out["accessConfig"] = {"externalIp": e.external_ip}
    return out


# QueuedResourceState has a data message for these states only
_STATE_DATA = {
    "CREATING": "creatingData",
    "ACCEPTED": "acceptedData",
    "PROVISIONING": "provisioningData",
    "FAILED": "failedData",
    "DELETING": "deletingData",
    "ACTIVE": "activeData",
    "SUSPENDING": "suspendingData",
    "SUSPENDED": "suspendedData",
}


@dataclass
class QueuedResource:
    """A request for one node, or for ``node_count`` nodes named ``{node_prefix}-{i}`` (a
    multislice), that waits for capacity for all of them, then provisions them."""

    project: str
    zone: str
    qr_id: str
    node_id: str
    node_request: dict
    request: dict
    spot: bool = False
    node_count: int = 1
    node_prefix: str | None = None  # set: a multislice (multisliceParams), node_id is empty
    state: str = "WAITING_FOR_RESOURCES"
    state_initiator: str | None = None
    failed_error: dict | None = None
    delete_op: Operation | None = None
    attempts: int = 0  # times it looked for capacity (emulator-only, shown in the admin state)
    create_time: str = field(default_factory=now_rfc3339)
    created_at: float = field(default_factory=time.monotonic)  # for queueingPolicy.validUntilDuration

    @property
    def valid_for(self) -> float | None:
        """queueingPolicy.validUntilDuration in seconds ("90s" in proto3 JSON), or None."""
        text = str((self.request.get("queueingPolicy") or {}).get("validUntilDuration") or "")
        return float(text.rstrip("s")) if text else None

    @property
    def name(self) -> str:
        return f"projects/{self.project}/locations/{self.zone}/queuedResources/{self.qr_id}"

    @property
    def parent(self) -> str:
        return f"projects/{self.project}/locations/{self.zone}"

    @property
    def node_ids(self) -> list[str]:
        if self.node_prefix is None:
            return [self.node_id]
        return [f"{self.node_prefix}-{i}" for i in range(self.node_count)]

    @property
    def node_names(self) -> list[str]:
        return [f"{self.parent}/nodes/{node_id}" for node_id in self.node_ids]

    def to_json(self) -> dict:
        state: dict[str, Any] = {"state": self.state}
        if self.state in _STATE_DATA:
            failed = self.state == "FAILED" and self.failed_error  # only FailedData has an error field
            state[_STATE_DATA[self.state]] = {"error": self.failed_error} if failed else {}
        if self.state_initiator:
            state["stateInitiator"] = self.state_initiator
        out: dict[str, Any] = {
            "name": self.name,
            "createTime": self.create_time,
            "tpu": {"nodeSpec": [{"parent": self.parent, **self._which_nodes(), "node": self.node_request}]},
            "state": state,
        }
        if self.spot:
            out["spot"] = {}
        for key in ("guaranteed", "queueingPolicy", "reservationName"):
            if self.request.get(key):
                out[key] = self.request[key]
        return out

    def _which_nodes(self) -> dict:
        if self.node_prefix is None:
            return {"nodeId": self.node_id}
        return {"multisliceParams": {"nodeCount": self.node_count, "nodeIdPrefix": self.node_prefix}}
