"""The emulated VMs' side of the API: their metadata servers' answers, their access tokens and
who they let log in (the guest agent's metadata users, or OS Login's), and the guest attributes
they write. A base class of ``Emulator`` (state.py): its methods read the emulator's nodes, hosts,
accounts and tokens, and run under its lock."""

from __future__ import annotations

import secrets
import time
from typing import TYPE_CHECKING

from tpunb.sandbox.iam.accounts import Accounts, default_service_account
from tpunb.sandbox.compute.compute_metadata import instance_attributes
from tpunb.sandbox.compute.compute_records import Vm
from tpunb.sandbox.hosts.pool import HostPool, parse_user_keys
from tpunb.sandbox.tpu.resources import ApiError, Node, QueuedResource

if TYPE_CHECKING:
    from tpunb.sandbox.tpu.request_checks import Faults
    from tpunb.sandbox.compute.compute import ComputeEngine


def tpu_attributes(node: Node, worker: int, megascale: dict | None = None) -> dict[str, str]:
    """The instance attributes Cloud TPU sets on each worker VM, as JAX's cloud_tpu_cluster and
    torch_xla read them (docs/cloud-facts.md: a v6e-1 VM's and a v4-256 VM's, as recorded by users):
    ``tpu-env`` is ``KEY: 'value'`` lines; ``worker-network-endpoints`` is ``name:id:ip`` per worker,
    in worker order. ``megascale``: a multislice's MEGASCALE_* for this node (its slice id, ...)."""
    ips = [e.internal_ip for e in node.endpoints]
    hosts = max(1, len(ips))
    env = {"ACCELERATOR_TYPE": node.accelerator, "CONSUMER_PROJECT_ID": node.project, "NODE_ID": node.node_id,
           "PREEMPTIBLE": "true" if (node.spot or node.preemptible) else "false", "RUNTIME_VERSION": node.runtime,
           "SERVICE_NAME": "tpu.googleapis.com", "TOPOLOGY": node.topology, "TPU_ACCELERATOR_TYPE": node.accelerator,
           "TPU_RUNTIME_METRICS_PORTS": "8431,8432,8433,8434", "TYPE": node.generation.upper(),
           "WORKER_ID": str(worker), "ZONE": node.zone, **(megascale or {})}
    return {"accelerator-type": node.accelerator, "agent-worker-number": str(worker),
            "worker-network-endpoints": ",".join(f"t1v-n-{node.numeric_id % 10**8:08x}-w-{i}:{node.numeric_id}-{i}:{ip}"
                                                 for i, ip in enumerate(ips[:hosts])),
            "tpu-env": "".join(f"{key}: '{value}'\n" for key, value in sorted(env.items()))}


class VmSide:
    """What the VMs of the emulator's nodes see and do."""

    nodes: dict[str, Node]
    queued: dict[str, QueuedResource]
    noticed: dict[str, Node]
    hosts: HostPool
    accounts: Accounts
    faults: "Faults"
    tokens: dict[str, tuple[str, float, str]]
    compute: "ComputeEngine"

    @staticmethod
    def service_account(node: Node) -> str:
        """Who the node's VMs are: the account named at create, else the project's default."""
        email = str((node.request.get("serviceAccount") or {}).get("email") or "")
        return email if email and email != "default" else default_service_account(node.project)

    # -- the VMs' side: metadata server and their access tokens ---------------------------

    def metadata_answer(self, address: str, path: str) -> str | dict | None:
        """What the metadata server at host ``address`` answers for ``path`` (None: 404)."""
        owner = self.hosts.owner_of(address) or ""
        node = self.nodes.get(owner)
        if node is None:
            vm = self.compute.instances.get(owner)
            return None if vm is None else self._instance_answer(vm, path)
        worker = [e.internal_ip for e in node.endpoints].index(address)
        attributes = {**node.metadata, **tpu_attributes(node, worker, self._megascale(node))}
        noticed = self.noticed.get(node.name) is node
        if path == "instance/preempted":  # Compute Engine's notice: TRUE from the notice on
            return "TRUE" if noticed or node.state in ("PREEMPTED", "TERMINATED") else "FALSE"
        if path == "instance/maintenance-event":
            return "TERMINATE_ON_HOST_MAINTENANCE" if noticed else "NONE"
        if path == "instance/service-accounts/default/token":
            return {"access_token": self._issue_token(node), "expires_in": 3599, "token_type": "Bearer"}
        if path == "instance/service-accounts/default/email":
            return self.service_account(node)
        if path == "instance/attributes/":
            return "\n".join(sorted(attributes))
        if path.startswith("instance/attributes/"):
            return attributes.get(path[len("instance/attributes/"):])
        network = str((node.request.get("networkConfig") or {}).get("network") or "default").rsplit("/", 1)[-1]
        return {"project/project-id": node.project, "instance/zone": f"projects/{node.project}/zones/{node.zone}",
                "instance/network-interfaces/0/network": f"projects/{node.project}/networks/{network}",
                "instance/hostname": f"t1v-n-{node.node_id}-w-{attributes['agent-worker-number']}"}.get(path)

    def _instance_answer(self, vm: Vm, path: str) -> str | dict | None:
        """What a Compute Engine instance's metadata server answers: its metadata and, for a TPU VM,
        ``worker-id``, ``tpu-env`` and bare-hostname ``worker-network-endpoints`` (no ``agent-worker-number``)."""
        attributes = {**vm.metadata, **instance_attributes(vm, *self.compute.slice_of(vm))}
        accounts = vm.properties.get("serviceAccounts") or [{}]
        email = str(accounts[0].get("email") or "")
        principal = email if email and email != "default" else default_service_account(vm.project)
        network = str((vm.properties.get("networkInterfaces") or [{}])[0].get("network") or "default").rsplit("/", 1)[-1]
        answers = {"instance/preempted": "TRUE" if vm.noticed else "FALSE",
                   "instance/maintenance-event": "TERMINATE_ON_HOST_MAINTENANCE" if vm.noticed else "NONE",
                   "instance/service-accounts/default/email": principal, "instance/attributes/": "\n".join(sorted(attributes)),
                   "project/project-id": vm.project, "instance/zone": f"projects/{vm.project}/zones/{vm.zone}",
                   "instance/name": vm.name, "instance/id": vm.id,
                   "instance/hostname": f"{vm.name}.{vm.zone}.c.{vm.project}.internal",
                   "instance/network-interfaces/0/network": f"projects/{vm.project}/networks/{network}"}
        if path == "instance/service-accounts/default/token":
            return {"access_token": self._token_for(vm.project, principal), "expires_in": 3599, "token_type": "Bearer"}
        if path.startswith("instance/attributes/") and path != "instance/attributes/":
            return attributes.get(path[len("instance/attributes/"):])
        return answers.get(path)

    def _megascale(self, node: Node) -> dict | None:
        """A multislice node's MEGASCALE_* (as its VMs' tpu-env carries them): the slices, this
        node's slice id, and worker 0 of slice 0 as the coordinator."""
        qr = self.queued.get(node.queued_resource or "")
        if qr is None or qr.node_prefix is None or node.node_id not in qr.node_ids:
            return None
        first = self.nodes.get(qr.node_names[0])
        coordinator = first.endpoints[0].internal_ip if first is not None and first.endpoints else ""
        return {"MEGASCALE_COORDINATOR_ADDRESS": coordinator, "MEGASCALE_NUM_SLICES": str(qr.node_count),
                "MEGASCALE_SLICE_ID": str(qr.node_ids.index(node.node_id))}

    def put_guest_attribute(self, address: str, path: str, value: str) -> bool | None:
        """A VM writes ``NAMESPACE/KEY`` of its own guest attributes: None (no node), False (the
        node's metadata does not enable them, as on GCE), True (stored)."""
        owner = self.hosts.owner_of(address) or ""
        node = self.nodes.get(owner)
        if node is None:
            vm = self.compute.instances.get(owner)
            if vm is None:
                return None
            if vm.metadata.get("enable-guest-attributes", "").upper() != "TRUE":
                return False
            vm.guest_attributes[path] = value
            return True
        if node.metadata.get("enable-guest-attributes", "").upper() != "TRUE":
            return False
        worker = [e.internal_ip for e in node.endpoints].index(address)
        node.guest_attributes.setdefault(worker, {})[path] = value
        return True

    def _issue_token(self, node: Node) -> str:
        return self._token_for(node.project, self.service_account(node))

    def _token_for(self, project: str, principal: str) -> str:
        """An access token of ``principal`` in ``project`` (the one already given while it has 5 minutes left)."""
        now = time.time()
        for token, (owner, expiry, holder) in self.tokens.items():
            if (owner, holder) == (project, principal) and expiry - now > 300:
                return token
        token = "ya29.emulator-" + secrets.token_urlsafe(24)
        self.tokens[token] = (project, now + 3600, principal)
        return token

    def caller(self, authorization: str | None, project: str) -> str:
        """Who calls. No Authorization header: the project's user (how tpunb's kernel talks to the
        emulator). A bearer token must be one a VM got from the metadata server, unexpired, for
        this project: the call is its node's service account's."""
        if authorization is None:
            return self.accounts.user
        scheme, _, token = authorization.partition(" ")
        found = self.tokens.get(token.strip()) if scheme.lower() == "bearer" else None
        if found is None or found[1] < time.time():
            raise ApiError(401, "UNAUTHENTICATED", "Request had invalid authentication credentials. Expected OAuth 2 "
                           "access token, login cookie or other valid authentication credential.")
        if project and found[0] != project:
            raise ApiError(403, "PERMISSION_DENIED", f"The caller does not have permission on project {project}")
        return found[2]

    # -- who logs in to the VMs: metadata keys, or OS Login ------------------------------------

    def _logins(self, node: Node | Vm) -> dict[str, list[str]]:
        """User -> keys a READY node's VMs accept: the OS Login profiles' under OS Login, else the
        ``USER:KEY`` lines of the project's and the node's ``ssh-keys`` metadata (the guest agent's)."""
        if self.accounts.os_login_on(node.project, node.metadata):
            return self.accounts.login_keys(node.project)
        logins: dict[str, list[str]] = {}
        lines = f"{self.accounts.metadata(node.project).get('ssh-keys', '')}\n{node.metadata.get('ssh-keys', '')}"
        for user, key in parse_user_keys(lines):
            logins.setdefault(user, []).append(key)
        return logins

    def _sync_logins(self, node: Node | None = None) -> None:
        """Give a READY node's hosts (every READY node's, without one) the logins they have now."""
        for each in [node] if node is not None else list(self.nodes.values()):
            if each.state == "READY":
                self.hosts.set_logins(each.name, self._logins(each))
        for vm in list(self.compute.instances.values()) if node is None else []:
            if vm.status == "RUNNING":
                self.sync_vm_logins(vm.path, vm)

    def sync_vm_logins(self, owner: str, vm: Vm) -> None:
        """Give a RUNNING Compute Engine instance's host the logins it has now (as a node's)."""
        self.hosts.set_logins(owner, self._logins(vm))

    def import_ssh_key(self, principal: str, email: str, body: dict, project: str) -> dict:
        answer = self.accounts.import_key(principal, email, body, project)
        self._sync_logins()  # a VM under OS Login asks for the profile's keys at every login
        return answer

    def set_accounts(self, changes: dict) -> dict:
        answer = self.accounts.update(changes)
        self._sync_logins()  # roles and project metadata decide who logs in where
        return answer
