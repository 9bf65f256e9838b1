"""Each Compute Engine VM's SSH host key, pinned from what the VM itself publishes: its guest agent
writes its host keys as guest attributes under ``hostkeys/`` (namespace ``hostkeys``, the key type
as key, the base64 key as value) when ``enable-guest-attributes`` is on, which tpunb sets, and
``gcloud compute ssh`` reads them the same way (docs/cloud-facts.md). So a new VM on an address
that an old one had (internal IPs are handed out again all the time) is reached with its own key,
not refused for the old one's, and a host that presents another key than its VM published is
refused before any cell runs. A VM that publishes none within the wait is trusted on first use,
as the Cloud TPU path does, its address's old key forgotten."""
from __future__ import annotations

import re
import time

from tpunb import report
from tpunb.errors import HostKeyError
from tpunb.provision.gcp import shared
from tpunb.provision.gcp.compute import clients
from tpunb.registry import Registry, SliceRecord

#: the key types paramiko and OpenSSH agree on, in the order a pin prefers them
KEY_TYPES = ("ssh-ed25519", "ecdsa-sha2-nistp256", "rsa-sha2-512", "ssh-rsa")
#: at most this long for a VM's guest agent to publish its keys once the VM runs
PUBLISH_WAIT = 60.0


def published(project: str, zone: str, instance: str) -> dict[str, str]:
    """The host keys a VM published: key type -> base64 key ({} while it has published none)."""
    from google.api_core import exceptions

    try:
        answer = clients.call("read the VM's host keys", clients.clients().instances.get_guest_attributes,
                              request={"project": project, "zone": zone, "instance": instance,
                                       "query_path": "hostkeys/"})
    except exceptions.NotFound:  # "The resource 'hostkeys/' of type 'Guest Attribute' was not found."
        return {}
    keys = {}
    for item in answer.query_value.items:
        value = (item.value or "").split()
        if item.namespace == "hostkeys" and item.key in KEY_TYPES and value:
            keys[item.key] = value[0]
    return keys


def _place(address: str) -> tuple[str, int]:
    from tpunb.transport.ssh_hosts import parse_host

    _, host, port = parse_host(address)
    return host, port


def pin(record: SliceRecord, reg: Registry, wait: float = PUBLISH_WAIT) -> None:
    """Record each host's published key for its address (replacing any older one there); a VM that
    publishes none within ``wait`` seconds gets its address's old key forgotten (trust on first use)."""
    spec = record.spec
    waiting = {h.index: h for h in record.hosts}
    deadline, delays = time.monotonic() + wait, shared.poll_delays()
    while waiting:
        for index, host in list(waiting.items()):
            keys = published(spec["project"], spec["zone"], host.info.extra.get("instance") or record.name)
            if keys:
                kind = next(k for k in KEY_TYPES if k in keys)
                address, port = _place(host.address)
                reg.forget_host_key(address, port)
                reg.set_host_key(address, port, kind, keys[kind])
                del waiting[index]
        if not waiting or time.monotonic() > deadline:
            break
        shared.pause(min(next(delays), max(0.0, deadline - time.monotonic())))
    for host in waiting.values():
        address, port = _place(host.address)
        reg.forget_host_key(address, port)
    if waiting:
        report.info(f"[tpunb] {len(waiting)} VM{'s' if len(waiting) > 1 else ''} of {record.name} published no SSH "
                    f"host key in {wait:g} s (guest attributes hostkeys/): trusting the key each shows on first use")


def refused(record: SliceRecord, error: HostKeyError) -> HostKeyError:
    """A host whose key is not its VM's published one, as one line (no advice to accept it)."""
    found = re.search(r"host key of (\S+) changed \(recorded ([^,]+), now ([^)]+)\)", str(error))
    what = f"{found[1]} presents {found[3]}, its VM published {found[2]}" if found else str(error).splitlines()[0]
    return HostKeyError(f"{record.name}: a host's SSH key is not the one its VM published in its guest attributes "
                        f"(hostkeys/): {what}; refused before any cell ran")
