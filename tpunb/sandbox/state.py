"""The emulated Cloud TPU v2 API as a state machine driven by a clock.

Nodes go CREATING -> READY; queued resources WAITING_FOR_RESOURCES -> PROVISIONING -> ACTIVE
(creating their node on the way); deletes go DELETING -> gone; spot nodes can be PREEMPTED
(their queued resource then SUSPENDED). Transitions are timed events on one heap, applied by a
clock thread and also before every request, so what a client reads never lags the clock.
Faults and the checks requests pass first live in ``checks``; what the VMs see and do (metadata
answers, tokens, logins) in ``vms``; who may call what in ``accounts``.
"""

from __future__ import annotations

import heapq
import itertools
import secrets
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from tpunb import catalog
from tpunb.sandbox.iam.accounts import Accounts
from tpunb.sandbox.tpu.request_checks import ID_RE, Faults, RequestChecks, Timings
from tpunb.sandbox.compute.compute import ComputeEngine
from tpunb.sandbox.hosts.pool import HostPool
from tpunb.sandbox.hosts.vms import VmSide
from tpunb.sandbox.tpu.resources import EMPTY_TYPE, TYPE_PREFIX, ApiError, Node, Operation, QueuedResource, eid

RESOURCE_EXHAUSTED, ABORTED = 8, 10
#: what a READY node can be made to become (the admin's preempt): its VMs stop answering
LOST_STATES = ("PREEMPTED", "TERMINATED", "STOPPED", "STOPPING", "DELETING", "HIDDEN", "REPAIRING", "UNKNOWN")


class Emulator(RequestChecks, VmSide):
    """All nodes, queued resources and operations of every project, plus the clock."""

    def __init__(
        self, timings: Timings | None = None, faults: Faults | None = None, hosts: HostPool | None = None
    ) -> None:
        self.timings = timings or Timings()
        self.faults = faults or Faults()
        self.hosts = hosts or HostPool()
        self._initial = (asdict(self.timings), asdict(self.faults))
        self.accounts = Accounts()
        self.accounts.os_login_everywhere = self.faults.os_login
        self.nodes: dict[str, Node] = {}
        self.queued: dict[str, QueuedResource] = {}
        self.operations: dict[str, Operation] = {}
        self._lock = threading.RLock()
        self._wake = threading.Condition(self._lock)
        self._events: list[tuple[float, int, Callable[..., None], tuple]] = []
        self._seq = itertools.count()
        self._stopped = False
        self.tokens: dict[str, tuple[str, float, str]] = {}  # VM access token -> (project, expiry, principal)
        self.noticed: dict[str, Node] = {}  # node name -> the node (that one, not a later one) given the notice
        self.closers: list[Callable[[], None]] = []  # run by close(): the metadata server
        self.compute = ComputeEngine(self)  # the Compute Engine API's resources, on this clock and host pool
        self._clock = threading.Thread(target=self._run_clock, name="tpu-emulator-clock", daemon=True)
        self._clock.start()

    # -- clock ---------------------------------------------------------------------------

    def _at(self, delay: float, fn: Callable[..., None], *args: Any) -> None:
        heapq.heappush(self._events, (time.monotonic() + max(0.0, delay), next(self._seq), fn, args))
        self._wake.notify()

    def at(self, delay: float, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` on the clock ``delay`` seconds from now (for the Compute Engine side)."""
        self._at(delay, fn, *args)

    def advance(self) -> None:
        """Apply every transition that is due (the caller holds the lock)."""
        self._advance()

    def _advance(self) -> None:
        while self._events and self._events[0][0] <= time.monotonic():
            _, _, fn, args = heapq.heappop(self._events)
            fn(*args)

    def _run_clock(self) -> None:
        with self._wake:
            while not self._stopped:
                self._advance()
                timeout = self._events[0][0] - time.monotonic() if self._events else None
                self._wake.wait(timeout)

    def close(self) -> None:
        """Stop the clock and take every key we installed back out of authorized_keys."""
        with self._wake:
            self._stopped = True
            self._wake.notify()
        self._clock.join(timeout=5)
        for closer in self.closers:
            closer()
        self.hosts.remove_all_keys()
        self.hosts.close()

    def call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run one API call under the lock, after applying every transition that is due."""
        with self._lock:
            self._advance()
            return method(*args, **kwargs)

    def _new_operation(self, project: str, zone: str, verb: str, target: str) -> Operation:
        op_id = f"operation-{int(time.time() * 1000)}-{secrets.token_hex(6)}"
        name = f"projects/{project}/locations/{zone}/operations/{op_id}"
        op = Operation(name=name, verb=verb, target=target)
        self.operations[name] = op
        return op

    def _ssh_port(self) -> int:
        return self.hosts.ssh_port

    # -- nodes ---------------------------------------------------------------------------

    def create_node(self, project: str, zone: str, node_id: str, body: dict) -> dict:
        self._check_location(project, zone)
        self._check_create(project, zone, "nodes", node_id)
        acc = self._check_node_request(zone, body)
        sched = body.get("schedulingConfig") or {}
        spot = bool(sched.get("spot"))
        self._check_quota_http(project, acc, zone, spot)
        name = f"projects/{project}/locations/{zone}/nodes/{node_id}"
        if name in self.nodes:
            raise ApiError(409, "ALREADY_EXISTS", f"Resource '{name}' already exists")
        node = self._new_node(
            project, zone, node_id, acc, body, spot=spot, preemptible=bool(sched.get("preemptible"))
        )
        node.create_op = op = self._new_operation(project, zone, "create", name)
        self.nodes[name] = node
        fail_after = self.timings.create_seconds / 2
        endpoints = (
            None if self.faults.stockout(zone) else self.hosts.allocate(name, acc.hosts, node.external_ips)
        )
        if self.faults.quota_in(zone) == "operation":
            self._at(
                fail_after, self._fail_create, node, RESOURCE_EXHAUSTED, self._quota_message(acc, zone, spot)
            )
        elif endpoints is None:
            self._at(fail_after, self._fail_create, node, RESOURCE_EXHAUSTED, self._stockout_message(zone))
        else:
            node.endpoints = endpoints
            self._at(self.timings.create_seconds + self.faults.slow_create, self._node_ready, node)
        return op.to_json()

    def _new_node(
        self, project: str, zone: str, node_id: str, acc: catalog.Accelerator, body: dict, **kw: Any
    ) -> Node:
        network = body.get("networkConfig") or {}
        return Node(
            project=project,
            zone=zone,
            node_id=node_id,
            accelerator=acc.name,
            generation=acc.generation,
            topology=acc.topology,
            hosts=acc.hosts,
            runtime=body["runtimeVersion"],
            request=body,
            external_ips=bool(network.get("enableExternalIps")),
            labels=dict(body.get("labels") or {}),
            metadata=dict(body.get("metadata") or {}),
            **kw,
        )

    def _stockout_message(self, zone: str) -> str:
        return (
            f'There is no more capacity in the zone "{zone}"; you can try in another zone where '
            f"Cloud TPU Nodes are offered (see https://cloud.google.com/tpu/docs/regions) {eid()}"
        )

    def _fail_create(self, node: Node, code: int, message: str) -> None:
        if node.state != "CREATING" or self.nodes.get(node.name) is not node:
            return
        del self.nodes[node.name]
        self.hosts.release(node.name)
        if node.create_op:
            node.create_op.finish(error={"code": code, "message": message})

    def _node_ready(self, node: Node) -> None:
        if node.state != "CREATING" or self.nodes.get(node.name) is not node:
            return
        node.state, node.health, node.endpoints_visible = "READY", "HEALTHY", True
        self._sync_logins(node)
        for endpoint in node.endpoints:  # each worker VM boots: its startup-script runs
            self.hosts.boot(endpoint.internal_ip, node.metadata.get("startup-script", ""))
        if node.create_op:
            node.create_op.finish(response={"@type": TYPE_PREFIX + "Node", **node.to_json(self._ssh_port())})
        qr = self.queued.get(node.queued_resource or "")
        if qr is not None and qr.state == "PROVISIONING" and all(
            getattr(self.nodes.get(name), "state", None) == "READY" for name in qr.node_names
        ):
            qr.state = "ACTIVE"  # a multislice: once its last node is READY
        if (node.spot or node.preemptible) and self.faults.preempt_after is not None:
            self._at(self.faults.preempt_after, self._preempt, node, "PREEMPTED")

    def _preempt(self, node: Node, state: str) -> None:
        if self.nodes.get(node.name) is not node or node.state in LOST_STATES:
            return
        if node.create_op and not node.create_op.done:
            node.create_op.finish(
                error={
                    "code": ABORTED,
                    "message": f"The TPU node was {state.lower()} during creation. {eid()}",
                }
            )
        node.state, node.health = state, None
        self.hosts.remove_keys(node.name)
        qr = self.queued.get(node.queued_resource or "")
        if qr is not None and qr.state in ("ACTIVE", "PROVISIONING"):
            qr.state, qr.state_initiator = "SUSPENDING", "SERVICE"
            self._at(self.timings.delete_seconds, self._qr_suspended, qr)

    def _qr_suspended(self, qr: QueuedResource) -> None:
        if self.queued.get(qr.name) is qr and qr.state == "SUSPENDING":
            qr.state = "SUSPENDED"

    def get_node(self, project: str, zone: str, node_id: str) -> dict:
        self._check_location(project, zone)
        return _find(self.nodes, f"projects/{project}/locations/{zone}/nodes/{node_id}").to_json(
            self._ssh_port()
        )

    def list_nodes(self, project: str, zone: str, page_size: int = 0, page_token: str = "") -> dict:
        self._check_location(project, zone, wildcard=True)
        items = [n.to_json(self._ssh_port()) for n in self._reachable(_in_location(self.nodes, project, zone), zone)]
        return self._unreachable(_page(items, "nodes", page_size, page_token), project, zone)

    def delete_node(self, project: str, zone: str, node_id: str) -> dict:
        self._check_location(project, zone)
        self._check_delete(project, zone, "nodes", node_id)
        node = _find(self.nodes, f"projects/{project}/locations/{zone}/nodes/{node_id}")
        return self._start_delete(node).to_json()

    def _start_delete(self, node: Node) -> Operation:
        if node.delete_op is not None:
            return node.delete_op
        if node.create_op and not node.create_op.done:
            node.create_op.finish(
                error={"code": ABORTED, "message": f"The TPU node was deleted during creation. {eid()}"}
            )
        node.state, node.health = "DELETING", None
        self.hosts.remove_keys(node.name)
        node.delete_op = op = self._new_operation(node.project, node.zone, "delete", node.name)
        self._at(self.timings.delete_seconds, self._node_gone, node)
        return op

    def update_node(self, project: str, zone: str, node_id: str, body: dict, mask: str) -> dict:
        """nodes.patch: the fields ``updateMask`` names (metadata, labels); the VMs see new keys at once."""
        self._check_location(project, zone)
        node = _find(self.nodes, f"projects/{project}/locations/{zone}/nodes/{node_id}")
        fields = {f.strip() for f in (mask or "").split(",") if f.strip()}
        unknown = fields - {"metadata", "labels"}
        if not fields or unknown:
            raise ApiError(400, "INVALID_ARGUMENT", f"updateMask must name metadata or labels, not {mask!r}.")
        if "metadata" in fields:
            node.metadata = {str(k): str(v) for k, v in (body.get("metadata") or {}).items()}
        if "labels" in fields:
            node.labels = {str(k): str(v) for k, v in (body.get("labels") or {}).items()}
        self._sync_logins(node)
        op = self._new_operation(project, zone, "update", node.name)
        op.finish(response={"@type": TYPE_PREFIX + "Node", **node.to_json(self._ssh_port())})
        return op.to_json()

    def get_guest_attributes(self, project: str, zone: str, node_id: str, body: dict) -> dict:
        """nodes.getGuestAttributes: one entry per worker (all, or ``workerIds``), in worker order."""
        self._check_location(project, zone)
        node = _find(self.nodes, f"projects/{project}/locations/{zone}/nodes/{node_id}")
        query = str(body.get("queryPath") or "")
        workers = [int(w) for w in body.get("workerIds") or range(len(node.endpoints))]
        entries = []
        for worker in workers:
            attributes = sorted((node.guest_attributes.get(worker) or {}).items())
            items = [{"namespace": path.split("/", 1)[0], "key": path.split("/", 1)[1], **({"value": value} if value else {})}
                     for path, value in attributes if path.startswith(query)]  # proto3 JSON: no empty value
            entry: dict = {"queryPath": query} if query else {}
            if items:
                entry["queryValue"] = {"items": items}
            entries.append(entry)
        return {"guestAttributes": entries} if entries else {}

    def _node_gone(self, node: Node) -> None:
        if self.nodes.get(node.name) is node:
            del self.nodes[node.name]
        self.hosts.release(node.name)
        if node.delete_op:
            node.delete_op.finish(response={"@type": EMPTY_TYPE})
        qr = self.queued.get(node.queued_resource or "")
        if qr is not None and qr.state not in ("DELETING", "SUSPENDED", "FAILED"):
            qr.state, qr.state_initiator = "SUSPENDED", "USER"

    # -- queued resources ----------------------------------------------------------------

    def create_queued(self, project: str, zone: str, qr_id: str, body: dict) -> dict:
        self._check_location(project, zone)
        self._check_create(project, zone, "queuedResources", qr_id)
        specs = (body.get("tpu") or {}).get("nodeSpec") or []
        parent = f"projects/{project}/locations/{zone}"
        if len(specs) != 1:
            raise ApiError(
                400,
                "INVALID_ARGUMENT",
                "The emulator supports queued resources with exactly one nodeSpec "
                "(a multislice is one nodeSpec with multisliceParams).",
            )
        spec = specs[0]
        if spec.get("parent", parent) != parent:
            raise ApiError(
                400, "INVALID_ARGUMENT", f"nodeSpec.parent must be {parent}, not {spec.get('parent')}."
            )
        node_id, node_body = spec.get("nodeId", ""), spec.get("node") or {}
        multislice = spec.get("multisliceParams")
        count, prefix = 1, None
        if multislice is not None:
            count, prefix = int(multislice.get("nodeCount") or 0), multislice.get("nodeIdPrefix") or qr_id
            if node_id:
                raise ApiError(400, "INVALID_ARGUMENT", "nodeSpec takes nodeId or multisliceParams, not both.")
            if count < 2:  # as the real API: one node is asked for with nodeId
                raise ApiError(400, "INVALID_ARGUMENT", f"multisliceParams.nodeCount must be > 1, not {count}.")
            node_id = f"{prefix}-{count - 1}"  # the longest id it makes: checked below
        if not ID_RE.match(node_id):
            raise ApiError(400, "INVALID_ARGUMENT", f'Invalid node id "{node_id}".')
        acc = self._check_node_request(zone, node_body)
        spot = "spot" in body or bool((node_body.get("schedulingConfig") or {}).get("spot"))
        self._check_quota_http(project, acc, zone, spot)
        qr = QueuedResource(project, zone, qr_id, "" if prefix else node_id, node_body, body, spot=spot,
                            node_count=count, node_prefix=prefix)
        if qr.name in self.queued:
            raise ApiError(409, "ALREADY_EXISTS", f"Resource '{qr.name}' already exists")
        for node_name in qr.node_names:
            if node_name in self.nodes:
                raise ApiError(409, "ALREADY_EXISTS", f"Resource '{node_name}' already exists")
        self.queued[qr.name] = qr
        op = self._new_operation(project, zone, "create", qr.name)
        op.finish(response={"@type": TYPE_PREFIX + "QueuedResource", **qr.to_json()})
        self._at(self.timings.queue_seconds, self._qr_try, qr, acc)
        return op.to_json()

    def _qr_try(self, qr: QueuedResource, acc: catalog.Accelerator) -> None:
        """Leave WAITING_FOR_RESOURCES if capacity (and quota) allow for every node, else look again later."""
        if self.queued.get(qr.name) is not qr or qr.state != "WAITING_FOR_RESOURCES":
            return
        qr.attempts += 1
        if qr.valid_for is not None and time.monotonic() - qr.created_at >= qr.valid_for:
            qr.state, qr.state_initiator = "FAILED", "SERVICE"  # "the request will be failed" (cloud_tpu.proto)
            qr.failed_error = {"code": 4, "message": "The queued resource was not provisioned within its "
                               f"valid_until_duration ({qr.valid_for:g}s). {eid()}"}
            return
        if self.faults.quota_in(qr.zone):
            qr.state, qr.state_initiator = "FAILED", "SERVICE"
            qr.failed_error = {
                "code": RESOURCE_EXHAUSTED,
                "message": self._quota_message(acc, qr.zone, qr.spot),
            }
            return
        taken = [n for n in qr.node_names if n in self.nodes]
        if taken:
            qr.state, qr.state_initiator = "FAILED", "SERVICE"
            qr.failed_error = {"code": 6, "message": f"Resource '{taken[0]}' already exists"}
            return
        nodes = [
            self._new_node(qr.project, qr.zone, node_id, acc, qr.node_request, spot=qr.spot, queued_resource=qr.name,
                           multislice=qr.node_prefix is not None)
            for node_id in qr.node_ids
        ]
        for node in nodes:  # all slices or none: a multislice waits until every one fits
            endpoints = (
                None
                if self.faults.stockout(qr.zone)
                else self.hosts.allocate(node.name, acc.hosts, node.external_ips)
            )
            if endpoints is None:
                for placed in nodes:
                    self.hosts.release(placed.name)
                self._at(self.timings.queue_seconds, self._qr_try, qr, acc)
                return
            node.endpoints = endpoints
        for node in nodes:
            self.nodes[node.name] = node
            self._at(self.timings.create_seconds + self.faults.slow_create, self._node_ready, node)
        qr.state = "PROVISIONING"

    def get_queued(self, project: str, zone: str, qr_id: str) -> dict:
        self._check_location(project, zone)
        return _find(self.queued, f"projects/{project}/locations/{zone}/queuedResources/{qr_id}").to_json()

    def list_queued(self, project: str, zone: str, page_size: int = 0, page_token: str = "") -> dict:
        self._check_location(project, zone, wildcard=True)
        items = [q.to_json() for q in self._reachable(_in_location(self.queued, project, zone), zone)]
        return self._unreachable(_page(items, "queuedResources", page_size, page_token), project, zone)

    def _reachable(self, found: list, zone: str) -> list:
        """A wildcard list leaves out what lives in a zone it cannot reach (the unreachable fault)."""
        cut = set(self.faults.unreachable or ()) if zone == "-" else set()
        return [r for r in found if r.zone not in cut]

    def _unreachable(self, page: dict, project: str, zone: str) -> dict:
        """AIP-217: a wildcard list names the locations it could not reach."""
        if zone == "-" and self.faults.unreachable:
            page["unreachable"] = [f"projects/{project}/locations/{z}" for z in self.faults.unreachable]
        return page

    def delete_queued(self, project: str, zone: str, qr_id: str, force: bool = False) -> dict:
        self._check_location(project, zone)
        self._check_delete(project, zone, "queuedResources", qr_id)
        qr = _find(self.queued, f"projects/{project}/locations/{zone}/queuedResources/{qr_id}")
        if qr.delete_op is not None:
            return qr.delete_op.to_json()
        nodes = [n for n in map(self.nodes.get, qr.node_names) if n is not None and n.queued_resource == qr.name]
        if any(n.state != "DELETING" for n in nodes) and not force:
            raise ApiError(
                400,
                "FAILED_PRECONDITION",
                f"Queued resource {qr.name} is {qr.state} and its node {nodes[0].node_id} exists: "
                "delete the node first or delete the queued resource with force=true.",
            )
        qr.state, qr.state_initiator = "DELETING", "USER"
        for node in nodes:
            self._start_delete(node)
        qr.delete_op = op = self._new_operation(project, zone, "delete", qr.name)
        self._at(self.timings.delete_seconds, self._queued_gone, qr)
        return op.to_json()

    def _queued_gone(self, qr: QueuedResource) -> None:
        for name in qr.node_names:
            node = self.nodes.get(name)
            if node is not None and node.queued_resource == qr.name:
                self._node_gone(node)
        self.queued.pop(qr.name, None)
        if qr.delete_op:
            qr.delete_op.finish(response={"@type": EMPTY_TYPE})

    # -- operations ----------------------------------------------------------------------

    def get_operation(self, name: str) -> dict:
        project, zone = name.split("/")[1], name.split("/")[3]
        self._check_location(project, zone)
        op = self.operations.get(name)
        if op is None:
            raise ApiError(404, "NOT_FOUND", f"Operation '{name}' was not found")
        return op.to_json()

    # -- admin ---------------------------------------------------------------------------

    def preempt(self, ref: str, after: float = 0.0, state: str | None = None, notice: float | None = None) -> dict:
        """Preempt a node (by id or full name) now or ``after`` seconds from now. ``notice``: first the
        preemption notice, as Compute Engine gives it (the metadata server's ``instance/preempted``
        turns TRUE, the guest's shutdown sends SIGTERM and stops sshd), then ``notice`` seconds later the node is
        PREEMPTED and its VMs are off (every process killed); ``notice=0``: they die with no notice."""
        matches = [n for name, n in self.nodes.items() if name == ref or n.node_id == ref]
        if not matches and self.compute.find(ref) is not None:  # a Compute Engine instance
            return self.compute.preempt(ref, float(after or 0), 30.0 if notice is None else float(notice))
        if not matches:
            raise ApiError(404, "NOT_FOUND", f"no node {ref!r} in the emulator")
        if len(matches) > 1:
            raise ApiError(400, "INVALID_ARGUMENT", f"node id {ref!r} is ambiguous: use the full name")
        state = (state or "PREEMPTED").upper()
        if state not in LOST_STATES:
            raise ApiError(400, "INVALID_ARGUMENT", f"state must be one of {', '.join(LOST_STATES)}")
        node = matches[0]
        if notice is not None:  # 0: no notice at all, the VMs just die
            if notice > 0:
                self._at(float(after or 0), self._notice, node, state, float(notice))
            self._at(float(after or 0) + float(notice), self._preempt_off, node, state)
        else:
            self._at(float(after or 0), self._preempt, node, state)
        self._advance()
        return {"node": node.name, "state": state, "after": float(after or 0),
                **({"notice": float(notice)} if notice is not None else {})}

    def _notice(self, node: Node, state: str, window: float) -> None:
        """The preemption notice reaches the node's VMs: metadata says so, and the guest's shutdown
        begins: SIGTERM to every process, sshd stopped (so the hosts' connections drop). The node is
        off when the window ends, or sooner once its VMs' last processes have ended."""
        if self.nodes.get(node.name) is not node or node.state != "READY":
            return
        self.noticed[node.name] = node
        self.hosts.shut_down([e.internal_ip for e in node.endpoints], window,
                             lambda: self.call_soon(self._preempt_off, node, state))

    def call_soon(self, fn: Callable[..., None], *args: Any) -> None:
        """``fn(*args)`` on the clock now, from any thread."""
        with self._wake:
            self._at(0, fn, *args)

    def _preempt_off(self, node: Node, state: str) -> None:
        """The window is over (or every VM's guest halted sooner): the node is preempted and its VMs
        are powered off."""
        self._preempt(node, state)
        if self.nodes.get(node.name) is node:
            for endpoint in node.endpoints:
                self.hosts.signal_processes(endpoint.internal_ip, signal.SIGKILL)

    def set_faults(self, changes: dict) -> dict:
        self.faults.update(changes)
        self._faults_changed()
        return asdict(self.faults)

    def clear_faults(self) -> dict:
        self.faults = Faults()
        self._faults_changed()
        return asdict(self.faults)

    def _faults_changed(self) -> None:
        if self.accounts.os_login_everywhere != self.faults.os_login:
            self.accounts.os_login_everywhere = self.faults.os_login  # enable-oslogin in every project
            self._sync_logins()

    def set_timings(self, changes: dict) -> dict:
        self.timings.update(changes)
        return asdict(self.timings)

    def reset(self) -> dict:
        """Forget every resource and go back to the faults and timings the emulator started with."""
        for name in list(self.nodes):
            self.hosts.release(name)
        self.compute.reset()
        self.hosts.remove_all_keys()
        self.nodes.clear()
        self.queued.clear()
        self.operations.clear()
        self.tokens.clear()
        self.noticed.clear()
        self._events.clear()
        self.timings = Timings(**self._initial[0])
        self.faults = Faults(**self._initial[1])
        self.accounts = Accounts()
        self.accounts.os_login_everywhere = self.faults.os_login
        return self.snapshot()

    def snapshot(self) -> dict:
        """Everything the emulator holds, for tests and leak checks."""
        port = self._ssh_port()
        return {
            "nodes": [
                dict(n.to_json(port), hosts=[e.internal_ip for e in n.endpoints]) for n in self.nodes.values()
            ],
            "queuedResources": [
                dict(q.to_json(), provisionAttempts=q.attempts) for q in self.queued.values()
            ],
            "pendingOperations": [o.name for o in self.operations.values() if not o.done],
            "faults": asdict(self.faults),
            "timings": asdict(self.timings),
            "accounts": self.accounts.snapshot(),
            "hosts": self.hosts.snapshot(),
            "compute": self.compute.snapshot(),
        }


def _find(table: dict[str, Any], name: str) -> Any:
    item = table.get(name)
    if item is None:
        raise ApiError(404, "NOT_FOUND", f"Resource '{name}' was not found")
    return item


def _in_location(table: dict[str, Any], project: str, zone: str) -> list[Any]:
    """Resources of ``project`` in ``zone`` ("-": every zone), oldest first."""
    prefix = f"projects/{project}/locations/" + ("" if zone == "-" else f"{zone}/")
    return [item for name, item in table.items() if name.startswith(prefix)]


def _page(items: list[dict], key: str, page_size: int, page_token: str) -> dict:
    start = int(page_token or 0)
    end = start + page_size if page_size > 0 else len(items)
    out: dict[str, Any] = {key: items[start:end]} if items[start:end] else {}  # no empty list, as the real API
    if end < len(items):
        out["nextPageToken"] = str(end)
    return out
