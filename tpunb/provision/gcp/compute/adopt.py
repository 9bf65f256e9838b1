"""A Compute Engine slice no registry here holds (Colab wipes ``~/.tpunb`` with its runtime):
%tpu_use NAME finds it with the survey's look (found.py, every zone at once), rebuilds its record
from the VMs and the ``tpunb-slice`` metadata its launch left on them, and gives this kernel's key
to the VMs: through OS Login when it is on, else in each instance's ``ssh-keys``
(``instances.setMetadata``; a MIG's VMs each get it, the template keeps the launch's key). The
hosts are numbered by the worker id each VM's metadata gives once they answer (``UNORDERED``)."""
from __future__ import annotations

import json
import os
import time

from tpunb import report
from tpunb.errors import ProvisionError
from tpunb.provision import ssh
from tpunb.provision.gcp import logins
from tpunb.provision.gcp.shared import KEY_ADDED, SLICE_METADATA
from tpunb.provision.gcp.compute import clients, found, hostkeys
from tpunb.provision.gcp.config import resolve_project_zone
from tpunb.registry import Registry, SliceRecord

#: in an adopted record's spec: its hosts are in the MIG's list order until the VMs say their worker ids
UNORDERED = "worker_order_unknown"


def adopt(name: str, reg: Registry, api: str, made_hosts) -> SliceRecord | None:
    """Slice ``name``'s record rebuilt from Compute Engine and saved; None when the project has no
    running tpunb slice of that name there. ``made_hosts``: the launch's host records of its VMs."""
    project, _ = resolve_project_zone(None, None)
    if project is None or not found.surveyed():
        return None
    every = [f for f in found.named(found.everything(project), name) if not f.leftover]
    if not every:
        return None
    if len(every) > 1:
        raise ProvisionError(f"{len(every)} slices named {name} exist in {project} (launched from other notebooks): "
                             f"%tpu_status lists them; %tpu_down {name} deletes them all", "lost")
    f = every[0]
    state = f.state()
    if state not in ("READY", "RUNNING"):
        raise ProvisionError(f"{name} is {state} in {project}/{f.zone} (Compute Engine), so there is nothing to "
                             f"attach: %tpu_down {name} deletes it", "lost")
    from tpunb.transport import keys

    metadata = {i.key: i.value for i in f.instances[0].metadata.items}
    saved = json.loads(metadata.get(SLICE_METADATA) or "{}")
    key_path, public_key = keys.default_key()
    access = logins.login(project, public_key, saved.get("user"), metadata, saved.get("service_account"))
    added = not access.os_login and add_ssh_key(project, f.zone, [v.name for v in f.instances], access.user,
                                                public_key)
    internal = all(not any(a.nat_i_p for a in v.network_interfaces[0].access_configs) for v in f.instances)
    if "interpreter" in saved:
        prepared = {"interpreter": saved["interpreter"], "setup": saved.get("setup")}
    else:  # made without tpunb's metadata: the default environment
        prepared = dict(zip(("interpreter", "setup"), ssh.setup_spec(saved.get("python"), None, None, None)))
    multi_host = f.mig is not None
    spec = {"api": api, "project": project, "zone": f.zone, "user": access.user, "python": saved.get("python"),
            "network": saved.get("network"), "service_account": saved.get("service_account"),
            **prepared, "spot": f.spot(), "internal_ip": internal, "key": str(key_path), "env_keys": [],
            "vms": len(f.instances), UNORDERED: multi_host, "launch": f.launch, **({"os_login": True} if access.os_login else {}),
            **({KEY_ADDED: time.time()} if added else {})}
    record = SliceRecord(name=name, accelerator=f.accelerator(), backend="gcp", state="running",
                         owner_pid=os.getpid(), spec=spec,
                         hosts=made_hosts(project, f.zone, name, multi_host, internal, f.launch))
    record.created = time.time() - f.age
    hostkeys.pin(record, reg)  # a new registry knows no key: each VM's own, as it published it
    reg.save_slice(record)
    how = "through OS Login" if access.os_login else "in its instances' ssh-keys metadata"
    report.info(f"[tpunb] {name} was in no registry here: found it in {project}/{f.zone} (Compute Engine) and gave "
                f"this kernel's key to its hosts ({how}, as {access.user})")
    return record


def add_ssh_key(project: str, zone: str, instances: list[str], user: str, public_key: str) -> bool:
    """``USER:KEY`` added to each instance's ``ssh-keys`` (setMetadata with the fingerprint read:
    the guest agent applies it within seconds); False when every one had it already."""
    from google.cloud import compute_v1

    c, line, changed = clients.clients(), f"{user}:{public_key.strip()}", False
    for vm_name in instances:
        vm = clients.call("read a VM", c.instances.get, project=project, zone=zone, instance=vm_name)
        items = {i.key: i.value for i in vm.metadata.items}
        lines = [entry for entry in items.get("ssh-keys", "").splitlines() if entry.strip()]
        if line in lines:
            continue
        items["ssh-keys"] = "\n".join([*lines, line])
        body = compute_v1.Metadata(fingerprint=vm.metadata.fingerprint,
                                   items=[compute_v1.Items(key=k, value=v) for k, v in items.items()])
        op = clients.call(f"give {vm_name} this kernel's key", c.instances.set_metadata_unary, project=project,
                          zone=zone, instance=vm_name, metadata_resource=body)
        clients.wait(project, op, f"give {vm_name} this kernel's key")
        changed = True
    return changed
