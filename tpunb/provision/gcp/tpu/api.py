"""Cloud TPU slices through google-cloud-tpu (tpu_v2 over REST): the one seam for cloud calls.

Four functions with dataclass records in and out: ``create`` (a node, or a queued resource with
``queued=True``, then wait for READY/ACTIVE), ``get``, ``delete`` and ``list_nodes``. A multislice
(``slices=N``) is one queued resource whose nodes ``{name}-0`` ... are seen, listed and deleted as
one NodeInfo named after it. Every node is labelled ``created-by=tpunb`` so orphans can be found
later, and a create that fails, times out or is interrupted deletes what it created before the
error reaches the user.

``TPUNB_TPU_API_ENDPOINT=http://127.0.0.1:8470`` points every call at the local emulator
(``python -m tpunb.sandbox``) with anonymous credentials and fast polling; otherwise
google.auth.default() credentials talk to the real API. google.cloud.tpu_v2 is imported on
first use, so ``import tpunb`` stays fast. The records (NodeSpec, NodeInfo, HostEndpoint) and
their conversion from API messages live in ``records``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from tpunb import catalog
from tpunb.errors import ProvisionError, UsageError
from tpunb.provision import interrupts, warm
from tpunb.provision.gcp import failures as gcp_errors
from tpunb.provision.gcp.shared import launch_of, new_launch
from tpunb.provision.gcp.config import cached, format_duration
from tpunb.provision.gcp.config import ENDPOINT_ENV, endpoint, require_project_zone, resolve_project_zone  # noqa: F401
from tpunb.provision.gcp import shared
from tpunb.provision.gcp.shared import DEFAULT_TIMEOUT
from tpunb.provision.gcp.tpu.spec import IDLE_ATTRIBUTE, LAUNCH_LABEL, idle_config, node_body  # noqa: F401
from tpunb.provision.gcp.tpu.records import (  # noqa: F401 - the records are part of this seam's API
    TPUNB_LABELS,
    HostEndpoint,
    NodeInfo,
    NodeSpec,
    info_from_node,
    info_from_multislice,
    queued_node_ids,
    info_from_queued,
    enum_name,
)

if TYPE_CHECKING:
    from google.cloud import tpu_v2

__all__ = [
    "ENDPOINT_ENV",
    "TPUNB_LABELS",
    "HostEndpoint",
    "NodeInfo",
    "NodeSpec",
    "create",
    "delete",
    "get",
    "list_nodes",
    "resolve_project_zone",
    "require_project_zone",
]

#: the registry's and %tpu_status's name for slices made through this API (Compute Engine's is ``compute``)
API = "tpu"
QUEUE_GRACE = 60.0  # after its valid_until_duration, how long a queued resource may take to be failed
DELETE_TIMEOUT = 600.0
#: what tpu.googleapis.com creates (tpu_v2's AcceleratorConfig.Type has these and no later one)
TPU_API_GENERATIONS = frozenset({"v2", "v3", "v4", "v5e", "v5p", "v6e"})
LOST_NODE_STATES = frozenset({"PREEMPTED", "TERMINATED", "STOPPED", "STOPPING", "DELETING", "HIDDEN"})
LOST_QUEUED_STATES = frozenset({"FAILED", "SUSPENDING", "SUSPENDED", "DELETING"})


# -- client --------------------------------------------------------------------------------

def _tpu() -> Any:
    warm.ready()  # imported on a side thread: a Ctrl-C now cannot leave it half-imported
    from google.cloud import tpu_v2

    return tpu_v2


def client() -> tpu_v2.TpuClient:
    """A TpuClient for the current endpoint (cached per endpoint)."""
    url = endpoint()

    def make() -> tpu_v2.TpuClient:
        tpu_v2 = _tpu()
        if url:
            from google.auth.credentials import AnonymousCredentials

            return tpu_v2.TpuClient(transport="rest", credentials=AnonymousCredentials(),
                                    client_options={"api_endpoint": url})
        return tpu_v2.TpuClient(transport="rest", credentials=shared.default_credentials())

    return cached(("tpu client", url or "google"), make)


def _api_errors() -> tuple[type[BaseException], ...]:
    from google.api_core.exceptions import GoogleAPICallError
    from google.auth.exceptions import GoogleAuthError

    return GoogleAPICallError, GoogleAuthError


def _translate(exc: BaseException, ctx: gcp_errors.Context) -> ProvisionError:
    from google.auth.exceptions import GoogleAuthError

    if isinstance(exc, GoogleAuthError):
        return ProvisionError(
            f"{gcp_errors.credentials_message()} ({gcp_errors.one_line(str(exc), 120)})", "credentials"
        )
    return gcp_errors.error(gcp_errors.from_exception(exc), ctx)


def call(fn: Callable[..., Any], ctx: gcp_errors.Context, **kw: Any) -> Any:
    """One API call whose failure becomes the one-line ProvisionError (for read-only lookups)."""
    try:
        return fn(**kw)
    except _api_errors() as e:
        raise _translate(e, ctx) from None


def _names(project: str, zone: str, name: str) -> tuple[str, str, str]:
    parent = f"projects/{project}/locations/{zone}"
    return parent, f"{parent}/nodes/{name}", f"{parent}/queuedResources/{name}"


def _get_or_none(getter: Callable[..., Any], name: str) -> Any:
    from google.api_core.exceptions import NotFound

    try:
        return getter(name=name)
    except NotFound:
        return None


def _queued_or_none(api: Any, name: str) -> Any:
    """A queued resource, or None when there is none or the caller may not read queued resources
    (a role with only tpu.nodes.*): a plain node never needs them."""
    from google.api_core.exceptions import PermissionDenied

    try:
        return _get_or_none(api.get_queued_resource, name)
    except PermissionDenied:
        return None


# -- create --------------------------------------------------------------------------------


#: while a queued resource waits for capacity, say how long it has waited this often (seconds)
WAIT_REPORT = 60.0


class _Transitions:
    """Calls ``on_state(state, elapsed)`` once per new state, in order; while a queued resource stays
    WAITING_FOR_RESOURCES, again every WAIT_REPORT seconds with the time it has waited."""

    def __init__(self, on_state: Callable[[str, float], Any] | None, started: float) -> None:
        self.on_state, self.started, self.last = on_state, started, None
        self.since = self.reported = started
        self.waited_in: str | None = None

    def see(self, state: str) -> None:
        now = time.monotonic()
        if state != self.last:
            if self.last not in (None, "FAILED"):
                self.waited_in = self.last  # what it was doing before it failed (a queued timeout says it)
            self.last, self.since, self.reported = state, now, now
            if self.on_state is not None:
                self.on_state(state, now - self.started)
        elif state == "WAITING_FOR_RESOURCES" and now - self.reported >= WAIT_REPORT and self.on_state is not None:
            self.reported = now
            self.on_state(f"{state}, waited {format_duration(now - self.since)}", now - self.started)


class _TimedOut(Exception):
    pass


class _OperationFailed(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def create(
    spec: NodeSpec,
    on_state: Callable[[str, float], Any] | None = None,
    timeout: float | None = DEFAULT_TIMEOUT,
) -> NodeInfo:
    """Create the node (or queued resource) and wait until it is READY (ACTIVE).

    ``on_state(state, elapsed_seconds)`` is called for every state seen, first to last. On any
    failure, timeout or interruption (also one raised by ``on_state``), whatever this call
    created is deleted before the error propagates; API failures become one-line
    ProvisionErrors whose ``.reason`` names the kind (quota, no_capacity, permission, ...).
    """
    attempt = Attempt(spec, on_state, timeout)
    delays = shared.poll_delays()
    try:
        while (info := attempt.poll()) is None:
            shared.pause(min(next(delays), attempt.time_left()))
        return info
    except ProvisionError:
        raise  # poll() has cleaned up and said so
    except BaseException as e:
        attempt.cancel("its launch was interrupted" if isinstance(e, KeyboardInterrupt) else "its launch failed")
        raise


class Attempt:
    """One create in flight: submitted when made, advanced one look at a time by ``poll``, so a
    caller can watch several at once (a zone race) and ``cancel`` the ones that lose."""

    def __init__(self, spec: NodeSpec, on_state: Callable[[str, float], Any] | None = None,
                 timeout: float | None = DEFAULT_TIMEOUT) -> None:
        acc = catalog.lookup(spec.accelerator)  # UnknownAcceleratorError: one line with suggestions
        if acc.generation not in TPU_API_GENERATIONS:  # docs/cloud-facts.md: "not supported on TPU7x and later"
            raise UsageError(f"{acc.name} cannot be created through the Cloud TPU API (Google serves TPU7x and "
                             "later through GKE or Compute Engine only): pick a v6e or older type")
        self.spec, self.timeout = spec, timeout
        self.ctx = gcp_errors.Context(spec.name, spec.project, spec.zone, acc.name, spec.spot, spec.queued)
        started = time.monotonic()
        self.queued = spec.queued or spec.slices > 1  # a multislice exists only as a queued resource
        # a queued resource is told its own limit (valid_until_duration): the API fails it then; this
        # side gives up only QUEUE_GRACE later, in case that never comes
        self.deadline = None if timeout is None else started + timeout + (QUEUE_GRACE if self.queued else 0.0)
        self.started = started
        self.watch = _Transitions(on_state, started)
        _, self.node_name, self.qr_name = _names(spec.project, spec.zone, spec.name)
        self.api = client()
        launch = new_launch()
        try:  # a Ctrl-C waits for the call: then the node (or request) exists, and is deleted below
            self.op = interrupts.whole(self._submit, node_body(_tpu(), spec, acc, launch))
        except _api_errors() as e:
            raise _translate(e, self.ctx) from None  # the API refused: nothing was created
        except BaseException:
            _delete_if_launched(spec, launch)  # interrupted mid-call: it may or may not exist
            raise

    def _submit(self, node: tpu_v2.Node) -> Any:
        spec, tpu_v2 = self.spec, _tpu()
        parent = f"projects/{spec.project}/locations/{spec.zone}"
        if not self.queued:
            return self.api.create_node(parent=parent, node_id=spec.name, node=node)
        node_spec = tpu_v2.QueuedResource.Tpu.NodeSpec(parent=parent, node=node)
        if spec.slices > 1:
            node_spec.multislice_params = tpu_v2.QueuedResource.Tpu.NodeSpec.MultisliceParams(
                node_count=spec.slices, node_id_prefix=spec.name
            )
        else:
            node_spec.node_id = spec.name
        queued = tpu_v2.QueuedResource(tpu=tpu_v2.QueuedResource.Tpu(node_spec=[node_spec]))
        if spec.spot:
            queued.spot = tpu_v2.QueuedResource.Spot()
        if self.timeout is not None:  # the request fails by itself once it has waited this long
            from google.protobuf import duration_pb2

            queued.queueing_policy = tpu_v2.QueuedResource.QueueingPolicy(
                valid_until_duration=duration_pb2.Duration(seconds=max(1, int(self.timeout))))
        return self.api.create_queued_resource(parent=parent, queued_resource_id=spec.name, queued_resource=queued)

    @property
    def state(self) -> str | None:
        """The last state seen (WAITING_FOR_RESOURCES, CREATING, ...), None before the first look."""
        return self.watch.last

    def time_left(self) -> float:
        return float("inf") if self.deadline is None else max(0.0, self.deadline - time.monotonic())

    def poll(self) -> NodeInfo | None:
        """One look: the node once READY (ACTIVE), else None. A failure or timeout deletes what
        this attempt made and raises the one-line ProvisionError."""
        spec = self.spec
        try:
            try:
                info = (_poll_queued if self.queued else _poll_node)(self.api, self.op, self.node_name, self.qr_name,
                                                                     self.watch)
            except _OperationFailed:
                if self.queued and self.timeout is not None and time.monotonic() - self.started >= self.timeout:
                    raise _TimedOut() from None  # its valid_until_duration ran out: the API failed it
                raise
            if info is None and self.deadline is not None and time.monotonic() >= self.deadline:
                raise _TimedOut()
            return info
        except _TimedOut:
            note = _cleanup(spec)
            what = "queued resource" if self.queued else "node"
            hint = "retry with a longer --timeout or another zone"
            if self.watch.last == "FAILED" and self.watch.waited_in:  # the API failed it at its time limit
                self.watch.last = self.watch.waited_in
            if self.watch.last == "WAITING_FOR_RESOURCES":
                hint = "no capacity came free: try another zone" + ("" if spec.spot else " or --spot")
            limit = "--timeout, its valid_until_duration" if self.queued else "--timeout"
            raise ProvisionError(
                f"{what} {spec.name} was still {self.watch.last or 'not visible'} after {self.timeout:g} s "
                f"({limit}); {note}; {hint}",
                "timeout",
            ) from None
        except _OperationFailed as e:
            raise gcp_errors.error(
                gcp_errors.from_status(e.code, e.message), _with_cleanup(self.ctx, _cleanup(spec))
            ) from None
        except ProvisionError as e:
            raise ProvisionError(f"{e} ({_cleanup(spec)})", e.reason or "lost") from None
        except _api_errors() as e:
            raise _translate(e, _with_cleanup(self.ctx, _cleanup(spec))) from None

    def cancel(self, why: str) -> str:
        """Delete what this attempt made (it lost a race, or the launch was interrupted)."""
        return _cleanup(self.spec, why)


def _with_cleanup(ctx: gcp_errors.Context, note: str) -> gcp_errors.Context:
    return gcp_errors.Context(ctx.name, ctx.project, ctx.zone, ctx.accelerator, ctx.spot, ctx.queued, note)


def _poll_node(api: Any, op: Any, node_name: str, qr_name: str, watch: _Transitions) -> NodeInfo | None:
    node = _get_or_none(api.get_node, node_name)
    if node is not None:
        state = enum_name(node.state)
        watch.see(state)
        if state == "READY":
            return info_from_node(node)
        if state in LOST_NODE_STATES:
            spot = bool(node.scheduling_config.spot or node.scheduling_config.preemptible)
            text = gcp_errors.preempted_message(node_name.rsplit("/", 1)[-1], state, spot)
            raise ProvisionError(text, "preempted" if state == "PREEMPTED" else "lost")
    if node is None and _operation_done(op):  # only then: a role with only tpu.nodes.* cannot read operations
        if op.operation.error.code:
            raise _OperationFailed(op.operation.error.code, op.operation.error.message)
        raise ProvisionError(f"node {node_name.rsplit('/', 1)[-1]} disappeared right after it was created", "lost")
    return None


def _operation_done(op: Any) -> bool:
    """The create operation finished; one the caller may not read (no tpu.operations.get) counts as
    finished without an error, so a vanished node is still said, only without the API's reason."""
    from google.api_core.exceptions import PermissionDenied

    try:
        return op.done()
    except PermissionDenied:
        return True


def _poll_queued(api: Any, op: Any, node_name: str, qr_name: str, watch: _Transitions) -> NodeInfo | None:
    if op.done() and op.operation.error.code:
        raise _OperationFailed(op.operation.error.code, op.operation.error.message)
    qr = _get_or_none(api.get_queued_resource, qr_name)
    if qr is None:
        return None
    state = enum_name(qr.state.state)
    watch.see(state)
    if state == "ACTIVE":
        if queued_node_ids(qr) == [node_name.rsplit("/", 1)[-1]]:
            return info_from_node(api.get_node(name=node_name), queued_state=state)
        info = info_from_multislice(qr, _nodes_of(api, qr))  # every node of a multislice, as one
        if info.ready:
            return info
    if state == "FAILED" and qr.state.failed_data.error.code:
        error = qr.state.failed_data.error
        raise _OperationFailed(error.code, error.message)
    if state in LOST_QUEUED_STATES:
        raise ProvisionError(f"queued resource {qr_name.rsplit('/', 1)[-1]} became {state} while waiting", "lost")
    return None


def _wait_or_time_out(delays: Iterator[float], deadline: float | None) -> None:
    delay = next(delays)
    if deadline is not None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise _TimedOut()
        delay = min(delay, left)
    shared.pause(delay)


def _nodes_of(api: Any, qr: Any) -> list[Any]:
    """The nodes of a queued resource that exist now."""
    parent = qr.name.split("/queuedResources/")[0]
    found = (_get_or_none(api.get_node, f"{parent}/nodes/{node_id}") for node_id in queued_node_ids(qr))
    return [node for node in found if node is not None]


def _cleanup(spec: NodeSpec, why: str = "its launch failed") -> str:
    """Delete what a failed create made; returns what happened, for the error message."""
    what = ("queued resource and its nodes" if spec.slices > 1 else
            "queued resource and node" if spec.queued else "node")
    queued = spec.queued or spec.slices > 1
    existed = delete_or_say(spec.project, spec.zone, spec.name, why, queued)
    if existed is None:
        return f"could not delete {what} {spec.name}: it is listed as an orphan in %tpu_status until it is gone"
    return f"deleted {what} {spec.name}" if existed else "nothing was left to clean up"


def _delete_if_launched(spec: NodeSpec, launch: str) -> None:
    """After an interrupted create call: delete the node only if this launch created it."""
    api = client()
    _, node_name, qr_name = _names(spec.project, spec.zone, spec.name)
    queued = spec.queued or spec.slices > 1
    try:
        if queued:
            qr = _get_or_none(api.get_queued_resource, qr_name)
            made = qr.tpu.node_spec[0].node if qr is not None and qr.tpu.node_spec else None
        else:
            made = _get_or_none(api.get_node, node_name)
    except Exception as e:  # cannot tell whether it exists: say how to check, while the interrupt goes up
        _say_left(spec.project, spec.zone, spec.name, queued, "its launch was interrupted", e)
        return
    if made is not None and launch_of(made) == launch:  # the token Compute Engine's resources carry too
        delete_or_say(spec.project, spec.zone, spec.name, "its launch was interrupted", queued)


def delete_command(project: str, zone: str, name: str, queued: bool = False) -> str:
    """The gcloud command that deletes a node (or a queued resource and its nodes) by hand."""
    if queued:
        return f"gcloud compute tpus queued-resources delete {name} --zone {zone} --project {project} --force"
    return f"gcloud compute tpus tpu-vm delete {name} --zone {zone} --project {project}"


def delete_or_say(project: str, zone: str, name: str, why: str, queued: bool = False) -> bool | None:
    """Delete a node a failed launch left; if that fails too, say so in one line with the command
    that deletes it, and record it as an orphan (%tpu_status and the sidebar list it until it is
    gone). True if deleted, False if nothing was there, None if it may still exist (and bill)."""
    try:
        return delete(project, zone, name, wait=True, queued=queued)
    except Exception as e:  # the original failure matters more: say what is left behind
        _say_left(project, zone, name, queued, why, e)
        return None


def _say_left(project: str, zone: str, name: str, queued: bool, why: str, error: BaseException) -> None:
    from tpunb import report
    from tpunb.registry import Registry

    reason = f"{why} and deleting it failed ({gcp_errors.one_line(str(error), 120)})"
    try:
        Registry().save_orphan(project, zone, name, reason)
    finally:
        report.warn(f"[tpunb] {name} may still exist and bill: {reason}; delete it with "
                    f"{delete_command(project, zone, name, queued)}")


# -- get / delete / list -------------------------------------------------------------------


def get(project: str, zone: str, name: str, queued: bool | None = None) -> NodeInfo | None:
    """The node called ``name`` (with its queued resource's state), its queued resource alone
    while the node does not exist yet, or None. ``queued=False`` (a plain node) asks for the
    node only; None (not known) asks for a queued resource only where one may be."""
    api = client()
    _, node_name, qr_name = _names(project, zone, name)
    ctx = gcp_errors.Context(name, project, zone)
    try:
        node = _get_or_none(api.get_node, node_name)
        if (node is not None and not node.queued_resource) or (node is None and queued is False):
            return info_from_node(node) if node is not None else None
        qr = _queued_or_none(api, node.queued_resource if node is not None else qr_name)
        if node is None and qr is not None and len(queued_node_ids(qr)) > 1:
            return info_from_multislice(qr, _nodes_of(api, qr))
    except _api_errors() as e:
        raise _translate(e, ctx) from None
    if node is not None:
        return info_from_node(node, queued_state=enum_name(qr.state.state) if qr is not None else None)
    return info_from_queued(qr) if qr is not None else None


def delete(project: str, zone: str, name: str, wait: bool = True, timeout: float = DELETE_TIMEOUT,
           queued: bool | None = None) -> bool:
    """Delete the node ``name`` and its queued resource; True if there was something to delete.

    Idempotent: a node that is already gone is success. With ``wait``, returns once both are gone.
    ``queued=False`` (a plain node) calls only node methods, so a role with only tpu.nodes.* can
    delete it; None (not known: an orphan, a node found in a survey) looks at the node first.
    """
    from google.api_core.exceptions import NotFound

    api, tpu_v2 = client(), _tpu()
    _, node_name, qr_name = _names(project, zone, name)
    ctx = gcp_errors.Context(name, project, zone)
    found = False
    try:
        if queued is None:
            node = _get_or_none(api.get_node, node_name)
            queued = node is None or bool(node.queued_resource)  # absent: perhaps a request still waiting
            if node is not None and node.queued_resource:
                qr_name = node.queued_resource
        qr = _queued_or_none(api, qr_name) if queued else None
        parent = qr_name.split("/queuedResources/")[0]
        node_names = [f"{parent}/nodes/{i}" for i in queued_node_ids(qr)] if qr is not None else [node_name]
        if qr is not None:  # force: also deletes the nodes the queued resource made (every slice of a multislice)
            try:
                api.delete_queued_resource(request=tpu_v2.DeleteQueuedResourceRequest(name=qr_name, force=True))
                found = True
            except NotFound:
                pass
        if not found:
            try:
                api.delete_node(name=node_name)
                found = True
            except NotFound:
                pass
        if found and wait:
            _wait_gone(api, node_names, qr_name if qr is not None else None, time.monotonic() + timeout)
    except _api_errors() as e:
        raise _translate(e, ctx) from None
    return found


def _wait_gone(api: Any, node_names: list[str], qr_name: str | None, deadline: float) -> None:
    delays = shared.poll_delays()
    while (qr_name is not None and _queued_or_none(api, qr_name) is not None) or any(
        _get_or_none(api.get_node, name) is not None for name in node_names
    ):
        try:
            _wait_or_time_out(delays, deadline)
        except _TimedOut:
            name = (qr_name or node_names[0]).rsplit("/", 1)[-1]
            raise ProvisionError(
                f"{name} is still being deleted; check it later with %tpu_status", "timeout"
            ) from None


def _every_page(pager: Any, field: str, unreachable: set[str]) -> list:
    """Every item of a list call, and the zones its pages say they could not reach (AIP-217:
    location names, ``projects/P/locations/Z``; the zone is the last part)."""
    items: list = []
    for page in pager.pages:
        items += list(getattr(page, field))
        unreachable.update(str(where).rsplit("/", 1)[-1] for where in getattr(page, "unreachable", ()))
    return items


def list_nodes(
    project: str, zone: str | None = None, label_filter: Mapping[str, str] | None = TPUNB_LABELS,
    unreachable: set[str] | None = None,
) -> list[NodeInfo]:
    """Nodes in ``zone`` (every zone if None) whose labels include ``label_filter``, plus queued
    resources whose node does not exist yet. ``label_filter=None`` lists everything. Zones a
    wildcard list could not reach (its responses' ``unreachable``) are added to ``unreachable``."""
    api = client()
    parent = f"projects/{project}/locations/{zone or '-'}"
    ctx = gcp_errors.Context("nodes", project, zone or "-")
    from google.api_core.exceptions import PermissionDenied

    missed: set[str] = set()
    try:
        nodes = _every_page(api.list_nodes(parent=parent), "nodes", missed)
        try:
            queued = _every_page(api.list_queued_resources(parent=parent), "queued_resources", missed)
        except PermissionDenied:  # a role with only tpu.nodes.*: its nodes are all it can have made
            queued = []
    except _api_errors() as e:
        raise _translate(e, ctx) from None
    if unreachable is not None:
        unreachable.update(missed)
    states = {q.name: enum_name(q.state.state) for q in queued}
    multislices = {q.name: q for q in queued if len(queued_node_ids(q)) > 1}
    infos = [info_from_node(n, states.get(n.queued_resource)) for n in nodes if n.queued_resource not in multislices]
    infos += [info_from_multislice(q, [n for n in nodes if n.queued_resource == name]) for name, q in multislices.items()]
    have = {(i.project, i.zone, i.name) for i in infos}
    infos += [q for q in map(info_from_queued, queued) if (q.project, q.zone, q.name) not in have]
    wanted = dict(label_filter or {})
    return [i for i in infos if all(i.labels.get(k) == v for k, v in wanted.items())]

