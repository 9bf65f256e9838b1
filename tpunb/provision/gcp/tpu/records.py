"""The records the Cloud TPU seam (``api``) takes and returns, and their conversion from the
API's node and queued-resource messages: plain dataclasses, no client, no calls."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from tpunb.provision.gcp.config import CloudOptions
from tpunb.provision.gcp.shared import SSH_PORT_LABEL, TPUNB_LABELS  # noqa: F401 - the seam's API

#: node states (tpu_v2 Node.State) whose hosts cannot run cells, and what each means for the user
UNUSABLE_STATES: Mapping[str, str] = {
    "PREEMPTED": "preempted", "TERMINATED": "terminated", "STOPPED": "stopped", "STOPPING": "being stopped",
    "DELETING": "being deleted", "HIDDEN": "hidden", "REPAIRING": "being repaired by Google",
    "UNKNOWN": "in a state Google cannot tell",
}


@dataclass(kw_only=True)
class NodeSpec(CloudOptions):
    """What to create: the launch's options plus the node's name, type and SSH access. ``name`` is
    both the node id and, with ``queued``, the queued resource id."""

    name: str
    accelerator: str
    project: str
    zone: str
    ssh_user: str | None = None
    ssh_public_key: str | None = None  # "ssh-ed25519 AAAA... comment", goes to metadata ssh-keys
    startup_script: str | None = None
    owner: str = ""  # who launches it (the account, else this machine's user): the tpunb-owner label
    os_login: bool = False  # the VMs take the key from OS Login: no ssh-keys metadata
    #: a multislice: one queued resource asks for this many nodes, named ``{name}-0``, ``{name}-1``, ...
    slices: int = 1
    #: what starts on each VM and the environment tpunb makes there (``host_setup``): kept in the
    #: node's tpunb-slice metadata so a re-attach from another machine asks for the same environment
    prepared: dict | None = None


@dataclass(frozen=True)
class HostEndpoint:
    """One worker VM of a slice, in networkEndpoints order (index = TPU worker id)."""

    index: int
    internal_ip: str
    external_ip: str | None
    port: int = 22  # its sshd
    slice: int = 0  # which node of a multislice it belongs to (index counts over all of them)

    def address(self, internal: bool = False) -> str:
        """The IP to connect to: external unless ``internal`` or the worker has none."""
        return self.internal_ip if internal or not self.external_ip else self.external_ip


@dataclass
class NodeInfo:
    """A node as the API reports it (or, before its node exists, a queued resource)."""

    name: str
    accelerator: str
    state: str | None  # node state (READY, CREATING, PREEMPTED...); None while only queued
    health: str | None
    hosts: list[HostEndpoint]
    spot: bool
    labels: dict[str, str]
    create_time: datetime | None
    queued_resource: str | None  # full name of its queued resource, if any
    project: str = ""
    zone: str = ""
    runtime: str = ""
    queued_state: str | None = None  # WAITING_FOR_RESOURCES, ACTIVE, SUSPENDED, FAILED...
    slices: int = 1  # a multislice: its nodes seen as one, named after their queued resource
    metadata: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def ready(self) -> bool:
        return self.state == "READY"

    @property
    def kind(self) -> str:
        """What status and the sidebar show: 'v4-16', or '2 x v4-16' for a multislice (as SliceRecord.kind)."""
        return f"{self.slices} x {self.accelerator}" if self.slices > 1 else self.accelerator

    @property
    def lost(self) -> bool:
        """Its hosts cannot run cells now: preempted, terminated, stopped, being deleted, hidden or
        under repair (UNUSABLE_STATES), or its queued resource suspended or failed."""
        return self.state in UNUSABLE_STATES or self.queued_state in ("SUSPENDED", "SUSPENDING", "FAILED")

    @property
    def tpunb_owned(self) -> bool:
        return all(self.labels.get(k) == v for k, v in TPUNB_LABELS.items())

    def uptime(self, now: datetime | None = None) -> float | None:
        """Seconds since creation, or None if unknown."""
        if self.create_time is None:
            return None
        return ((now or datetime.now(self.create_time.tzinfo)) - self.create_time).total_seconds()


def enum_name(value: Any) -> str:
    """An enum's name; a number this client's tpu_v2 does not know (a state the API added later; the
    REST transport asks for numbers) becomes STATE_<n> instead of an AttributeError."""
    return getattr(value, "name", None) or f"STATE_{int(value)}"


def info_from_node(node: Any, queued_state: str | None = None) -> NodeInfo:
    parts = node.name.split("/")
    port = int(node.labels.get(SSH_PORT_LABEL, 22) or 22)
    hosts = [
        HostEndpoint(i, ep.ip_address, ep.access_config.external_ip or None, port)
        for i, ep in enumerate(node.network_endpoints)
    ]
    return NodeInfo(
        name=parts[-1],
        accelerator=node.accelerator_type,
        state=enum_name(node.state),
        health=enum_name(node.health) if node.health else None,
        hosts=hosts,
        spot=bool(node.scheduling_config.spot or node.scheduling_config.preemptible),
        labels=dict(node.labels),
        create_time=node.create_time or None,
        queued_resource=node.queued_resource or None,
        project=parts[1],
        zone=parts[3],
        runtime=node.runtime_version,
        queued_state=queued_state,
        metadata=dict(node.metadata),
    )


def info_from_queued(qr: Any) -> NodeInfo:
    parts = qr.name.split("/")
    spec = qr.tpu.node_spec[0] if qr.tpu.node_spec else None
    node = spec.node if spec is not None else None
    return NodeInfo(
        name=(spec.node_id if spec is not None else "") or parts[-1],  # a multislice has no node_id
        accelerator=node.accelerator_type if node is not None else "",
        state=None,
        health=None,
        hosts=[],
        spot="spot" in qr,
        labels=dict(node.labels) if node is not None else {},
        create_time=qr.create_time or None,
        queued_resource=qr.name,
        project=parts[1],
        zone=parts[3],
        runtime=node.runtime_version if node is not None else "",
        queued_state=enum_name(qr.state.state),
        slices=max(1, len(queued_node_ids(qr))),
        metadata=dict(node.metadata) if node is not None else {},
    )


def queued_node_ids(qr: Any) -> list[str]:
    """The ids of the nodes a queued resource asks for: ``{prefix}-{i}`` for a multislice."""
    spec = qr.tpu.node_spec[0] if qr.tpu.node_spec else None
    if spec is None:
        return []
    params = spec.multislice_params
    if params.node_count:
        prefix = params.node_id_prefix or qr.name.rsplit("/", 1)[-1]
        return [f"{prefix}-{i}" for i in range(params.node_count)]
    return [spec.node_id]


def info_from_multislice(qr: Any, nodes: list[Any]) -> NodeInfo:
    """A multislice's nodes as one NodeInfo named after its queued resource: hosts numbered over
    every slice in slice order (as JAX numbers processes); READY only when every node is."""
    infos = [info_from_node(n, queued_state=enum_name(qr.state.state)) for n in nodes]
    order = {node_id: i for i, node_id in enumerate(queued_node_ids(qr))}
    infos.sort(key=lambda i: order.get(i.name, len(order)))
    base = info_from_queued(qr)
    hosts, states = [], []
    for slice_index, info in enumerate(infos):
        states.append(info.state)
        hosts += [dataclasses.replace(h, index=len(hosts) + k, slice=slice_index) for k, h in enumerate(info.hosts)]
    missing = len(infos) < base.slices
    unready = [s for s in states if s != "READY"]  # PREEMPTED on one node: the whole multislice is lost
    return dataclasses.replace(
        infos[0] if infos else base, name=base.name, hosts=hosts, queued_resource=qr.name, slices=base.slices,
        queued_state=base.queued_state,
        state=unready[0] if unready else None if missing else "READY",
        health=None if unready or missing else infos[0].health,
    )
