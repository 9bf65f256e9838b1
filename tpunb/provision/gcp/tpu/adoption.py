"""Nodes that outlived the notebook machine's files: find them anywhere, re-attach them.

Colab recycles its runtimes and wipes ``~/.tpunb`` (the registry, tpunb's SSH key) with them, and
Colab has no gcloud zone. A node still running is then in no registry and in no zone tpunb would
look at. So the survey lists every zone of the project at once (``everywhere``), tpunb's labels
say which nodes are its own, and ``adopt`` rebuilds a slice's record from the node alone: its
zone, hosts and type from the API, its login user, Python and idle limit from the node's
``tpunb-slice`` metadata (spec.py). The new kernel's key reaches the VMs through the node's
``ssh-keys`` metadata, or under OS Login through the account's profile, as at launch.
"""
from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping

from tpunb import catalog, report
from tpunb.errors import ProvisionError
from tpunb.transport.fanout import fan_out
from tpunb.provision import ssh
from tpunb.provision.gcp import logins
from tpunb.provision.gcp.tpu import api
from tpunb.provision.gcp import failures as gcp_errors
from tpunb.provision.gcp.config import resolve_project_zone
from tpunb.provision.gcp.tpu.records import NodeInfo
from tpunb.provision.gcp.shared import KEY_ADDED, NAME_LABEL, SLICE_METADATA, TPUNB_LABELS, label_value
from tpunb.registry import HostInfo, HostRecord, Registry, SliceRecord

#: after a key was added to a node's metadata, a connect retries this long (the guest agent applies it)


def everywhere(project: str, label_filter: Mapping[str, str] | None = TPUNB_LABELS) -> list[NodeInfo]:
    """Nodes in every zone of ``project``: one call on ``locations/-`` (the wildcard location of
    Google's AIP-159, docs/cloud-facts.md), then each zone it says it could not reach (AIP-217's
    ``unreachable``) on its own; if the API refuses the wildcard, every TPU zone of the catalog at
    once, each its own call (a zone the project cannot use lists nothing)."""
    def one(zone: str) -> list[NodeInfo]:
        try:
            return api.list_nodes(project, zone, label_filter)
        except ProvisionError as e:
            if e.reason in ("invalid_zone", "not_found"):
                return []
            raise

    def each(zones: list[str]) -> list[NodeInfo]:
        return [info for found in fan_out(zones, one, workers=8, name="tpunb-survey").values() for info in found]

    unreachable: set[str] = set()
    try:
        found = api.list_nodes(project, None, label_filter, unreachable)
    except ProvisionError as e:
        if e.reason not in ("invalid_zone", "invalid", "not_found"):
            raise
        return each(catalog.zones())
    return found + each(sorted(unreachable))  # what the wildcard missed, asked of each zone itself


def find(project: str, name: str) -> NodeInfo | None:
    """The tpunb node (or multislice) of slice ``name`` in any zone of ``project``."""
    for info in everywhere(project):
        if info.name == name or info.labels.get(NAME_LABEL) == label_value(name):
            return info
    return None


def add_ssh_key(project: str, zone: str, node_ids: list[str], user: str, public_key: str) -> bool:
    """Add ``USER:KEY`` to each node's ``ssh-keys`` metadata (nodes.patch, mask ``metadata``; the
    VMs' guest agent applies it within seconds); False when every node had it already."""
    from google.cloud import tpu_v2
    from google.protobuf import field_mask_pb2

    client = api.client()
    line = f"{user}:{public_key.strip()}"
    changed = False
    for node_id in node_ids:
        node_name = f"projects/{project}/locations/{zone}/nodes/{node_id}"
        context = gcp_errors.Context(node_id, project, zone)
        metadata = dict(api.call(client.get_node, context, name=node_name).metadata)
        lines = [entry for entry in metadata.get("ssh-keys", "").splitlines() if entry.strip()]
        if line in lines:
            continue
        metadata["ssh-keys"] = "\n".join([*lines, line])
        api.call(client.update_node, context, node=tpu_v2.Node(name=node_name, metadata=metadata),
                 update_mask=field_mask_pb2.FieldMask(paths=["metadata"]))
        changed = True
    return changed


def host_records(info: NodeInfo, internal_ip: bool, reg: Registry) -> list[HostRecord]:
    """The node's workers as the registry keeps them (address, port, internal IP, slice); a new VM
    has a new host key, even where an old one had its address, so none recorded there is kept."""
    from tpunb.transport.ssh_hosts import forget_host_key

    hosts = []
    for h in info.hosts:
        address = h.address(internal_ip)
        forget_host_key(address, h.port, reg)
        hosts.append(HostRecord(h.index, address if h.port == 22 else f"{address}:{h.port}",
                                HostInfo(internal_ip=h.internal_ip, slice=h.slice if info.slices > 1 else None)))
    return hosts


def adopt(name: str, reg: Registry) -> SliceRecord | None:
    """Re-attach slice ``name`` from its node when this registry does not know it: the record
    rebuilt and saved, this kernel's key given to the VMs. None when the project has no such node."""
    from tpunb.transport import keys

    project, _ = resolve_project_zone(None, None)
    if project is None:
        return None
    info = find(project, name)
    if info is None:
        return None
    if not info.ready:
        state = info.state or info.queued_state
        raise ProvisionError(f"{name} is {state} in {project}/{info.zone}, so there is nothing to attach: "
                             f"%tpu_down {name} deletes it", "lost")
    saved = json.loads(info.metadata.get(SLICE_METADATA) or "{}")
    key_path, public_key = keys.default_key()
    access = logins.login(project, public_key, saved.get("user"), info.metadata, saved.get("service_account"))
    node_ids = [name] if info.slices == 1 else [f"{name}-{i}" for i in range(info.slices)]
    added = not access.os_login and add_ssh_key(project, info.zone, node_ids, access.user, public_key)
    internal = all(h.external_ip is None for h in info.hosts)
    if "interpreter" in saved:  # the environment its launch asked for: the hosts only check it
        prepared = {"interpreter": saved["interpreter"], "setup": saved.get("setup")}
    else:  # a node from before environments were recorded: the default one
        prepared = dict(zip(("interpreter", "setup"), ssh.setup_spec(saved.get("python"), None, None, None)))
    spec = {"project": project, "zone": info.zone, "user": access.user, "python": saved.get("python"), **prepared,
            "idle_delete": float(saved.get("idle_delete") or 0), "spot": info.spot, "internal_ip": internal,
            "queued": info.queued_resource is not None, "key": str(key_path), "env_keys": [],
            **({"slices": info.slices} if info.slices > 1 else {}), **({"os_login": True} if access.os_login else {}),
            **({KEY_ADDED: time.time()} if added else {})}
    record = SliceRecord(name=name, accelerator=info.accelerator, backend="gcp", state="running",
                         owner_pid=os.getpid(), spec=spec, hosts=host_records(info, internal, reg))
    record.created = info.create_time.timestamp() if info.create_time else record.created
    reg.save_slice(record)
    how = "through OS Login" if access.os_login else "in the node's ssh-keys metadata"
    report.info(f"[tpunb] {name} was in no registry here: found it in {project}/{info.zone} and gave this "
                f"kernel's key to its hosts ({how}, as {access.user})")
    return record
