"""What a create asks for: the node message, with the labels and metadata tpunb gives every node.

Labels (what a survey filters on, and what survives a wiped notebook machine): ``created-by=tpunb``,
``tpunb-name`` (the slice), ``tpunb-owner`` (who launched it) and ``tpunb-idle`` (the idle limit in
seconds, or ``off``). Metadata ``tpunb-slice`` (JSON) keeps what a re-attach needs to rebuild the
slice's record from the node alone: its name, login user (and whether through OS Login), Python,
idle limit and slice count. ``ssh-keys`` carries tpunb's key outside OS Login; with idle autodelete,
``tpunb-idle`` and the startup-script arm the watchdog on worker 0 (tpunb/host/standalone/idle.py).
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from tpunb import catalog
from tpunb.errors import UsageError
from tpunb.provision.gcp.shared import LAUNCH_LABEL  # noqa: F401 - a node carries its launch's token
from tpunb.provision.gcp.config import endpoint
from tpunb.provision.gcp.shared import (IAM_ENDPOINT, IDLE_ATTRIBUTE, IDLE_LABEL, NAME_LABEL, OWNER_LABEL, SLICE_METADATA,  # noqa: F401
                                       TPUNB_LABELS, label_value)
from tpunb.provision.gcp.tpu.records import NodeSpec

if TYPE_CHECKING:
    from google.cloud import tpu_v2

PUBLIC_ENDPOINT = "https://tpu.googleapis.com"


def tpunb_labels(spec: NodeSpec) -> dict[str, str]:
    idle = int(spec.idle_delete) if spec.idle_delete else "off"
    return {**TPUNB_LABELS, NAME_LABEL: label_value(spec.name), OWNER_LABEL: label_value(spec.owner or "unknown"),
            IDLE_LABEL: label_value(idle)}


def slice_metadata(spec: NodeSpec) -> str:
    return json.dumps({"name": spec.name, "user": spec.ssh_user, "os_login": spec.os_login, "python": spec.python,
                       "idle_delete": spec.idle_delete or 0, "slices": spec.slices, "owner": spec.owner,
                       **(spec.prepared or {})},
                      sort_keys=True)


def node_body(tpu: Any, spec: NodeSpec, acc: catalog.Accelerator, launch: str) -> "tpu_v2.Node":
    """The Node message ``tpu`` (google.cloud.tpu_v2) sends for ``spec``."""
    metadata = {SLICE_METADATA: slice_metadata(spec)}
    if spec.ssh_public_key and not spec.os_login:  # under OS Login VMs ignore metadata keys
        metadata["ssh-keys"] = f"{spec.ssh_user or 'tpunb'}:{spec.ssh_public_key.strip()}"
    if spec.startup_script:
        metadata["startup-script"] = spec.startup_script
    if spec.idle_delete:
        if spec.startup_script:
            raise UsageError("idle_delete runs from the node's startup-script: give no startup_script with it")
        metadata.update(idle_metadata(spec))
    network = tpu.NetworkConfig(enable_external_ips=not spec.internal_ip)
    if spec.network:
        network.network = spec.network
    if spec.subnetwork:
        network.subnetwork = spec.subnetwork
    node = tpu.Node(
        accelerator_type=acc.name,
        runtime_version=spec.runtime or acc.default_runtime,
        network_config=network,
        labels={**spec.labels, **tpunb_labels(spec), LAUNCH_LABEL: launch},
        metadata=metadata,
    )
    if spec.service_account:
        node.service_account = tpu.ServiceAccount(
            email=spec.service_account, scope=["https://www.googleapis.com/auth/cloud-platform"]
        )
    if spec.spot and not (spec.queued or spec.slices > 1):  # a queued resource says spot itself (QueuedResource.spot)
        node.scheduling_config = tpu.SchedulingConfig(spot=True)
    return node


def idle_config(project: str, zone: str, name: str, seconds: float, queued: bool = False) -> dict:
    """What the slice's idle watchdog (tpunb/host/standalone/idle.py) needs, every Cloud TPU API call
    it makes as data: its limit, the API's root, the node and what it deletes (a queued resource,
    forced, with its node; as the kernel deletes it), the permissions that takes, and the one call
    that reads every worker's guest attributes."""
    node = f"projects/{project}/locations/{zone}/nodes/{name}"
    return {"seconds": seconds, "api": f"{(endpoint() or PUBLIC_ENDPOINT).rstrip('/')}/v2",
            "iam_endpoint": endpoint() or IAM_ENDPOINT, "node": node,
            "delete": f"{node.replace('/nodes/', '/queuedResources/')}?force=true" if queued else node,
            "permissions": ["tpu.nodes.delete"] + (["tpu.queuedResources.delete"] if queued else []),
            "attributes": {"all": f"{node}:getGuestAttributes"}}


def idle_metadata(spec: NodeSpec) -> dict[str, str]:
    """Node metadata that arms the watchdog at boot on worker 0, before any kernel attaches, and
    lets every worker tell it that a service runs there (guest attributes)."""
    from tpunb.transport.bundle import idle_script

    config = idle_config(spec.project, spec.zone, spec.name, spec.idle_delete, spec.queued)
    config["grace"] = spec.connect_wait  # at boot, the launching kernel has this long to attach
    # every worker's services report to worker 0's watchdog through guest attributes (idle.py)
    return {IDLE_ATTRIBUTE: json.dumps(config), "startup-script": idle_script(), "enable-guest-attributes": "TRUE"}
