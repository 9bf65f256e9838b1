"""Cloud TPU slices: the launch flow, and the backend functions every backend offers.

``create`` makes a node (or queued resource) with progress, waits for READY, and connects to
every worker over SSH; whatever fails or is interrupted after the node exists deletes it again.
``survey`` lists the project's nodes once per zone for %tpu_status, which is also how nodes
this registry does not know (orphans, still billed) are found.

The parts: ``api`` is the one seam for every Cloud TPU call, ``node`` the cloud side of an
attached slice, ``config`` the launch options and default project/zone, ``errors`` failures as
one-line messages, ``failover`` the zones (and types) a launch tries until one grants it,
``lookups`` read-only questions for %tpu_doctor.
"""
from __future__ import annotations

import dataclasses
import os
import time

from tpunb import catalog, diagnose, report
from tpunb.errors import AuthenticationError, CellInterrupted, HostSetupError, ProvisionError, TpunbError, UsageError
from tpunb.transport.fanout import fan_out
from tpunb.provision import ssh
from tpunb.provision.base import LaunchRequest, Made, Nodes
from tpunb.provision.common import owner_alive
from tpunb.provision import warm
from tpunb.provision.gcp import api
from tpunb.provision.gcp import errors as gcp_errors
from tpunb.provision.gcp import adopt as adoption
from tpunb.provision.gcp import common, compute, failover, logins, lookups, rest
from tpunb.provision.gcp.compute import found as on_compute
from tpunb.provision.gcp.prepare import host_setup, kept
from tpunb.provision.gcp.adopt import host_records
from tpunb.provision.gcp.config import (CloudOptions, colab_idle_default, format_duration, require_project_zone,
                                       resolve_project_zone)
from tpunb.provision.gcp.node import CloudNode, list_price, price_per_hour
from tpunb.registry import Registry, SliceRecord
from tpunb.slice import Node, Slice
from tpunb.status import OrphanStatus, SliceStatus

NAME = "gcp"
#: how the sidebar names it, and what deleting a slice of it does
LABEL = "gcp (Cloud TPU)"
ENDS = "its Cloud TPU node is deleted and billing stops"
CAPABILITIES = frozenset({"survey", "orphans", "adopt", "recover", "cloud", "doctor", "flags"})
#: a slice whose launch has not finished (or was cut off): one wording everywhere
CREATING = "being created (or its launch was cut off: %tpu_down deletes it)"
#: a failover's record, while it launches: every zone it may have made something in
TRIED = "failover_zones"
#: in a survey's nodes, (project, UNREACHED) -> {"tpu" | "compute": why that API could not be listed}
UNREACHED = "unreachable"


def default_name(accelerator: catalog.Accelerator) -> str:
    """``tpunb-USER-TYPE`` (common.default_name): two people in one project never share one. The
    user is read from the credentials: their modules are imported on the warm-up thread first,
    where a Ctrl-C cannot cut an import half-way (tpunb.provision.warm)."""
    warm.ready()
    return common.default_name(accelerator.name, logins.owner())


def options(**given) -> CloudOptions:
    return CloudOptions.from_kwargs(given)


def option_flags() -> list[dataclasses.Field]:
    """The launch options %tpu_launch offers as --flags (CloudOptions' fields with help)."""
    return CloudOptions.flags()


def default_place(project: str | None, zone: str | None) -> tuple[str | None, str | None]:
    """The project and zone a launch uses when not told: flags, environment, gcloud's config."""
    return resolve_project_zone(project, zone)


def doctor_checks() -> list:
    """%tpu_doctor's Cloud TPU checks: credentials, project, the API, quota, the zone's types."""
    from tpunb.provision.gcp import doctor

    return list(doctor.CHECKS)


#: the workers are SSH hosts: a transport to each from the record alone, as hosts you bring
record_transports = ssh.record_transports


def configured() -> bool:
    """A Google Cloud project is configured (flag, environment or gcloud): launches go to Cloud TPU."""
    return resolve_project_zone(None, None)[0] is not None


def create(request: LaunchRequest) -> Made:
    """Create a Cloud TPU node, wait for READY with progress, connect to every worker over SSH.
    Whatever fails or is interrupted after the node exists deletes it again (``Made.failed``, when
    it happens while the SliceManager starts the hosts).

    ``slices``: a multislice, one queued resource for that many nodes (``{name}-0``, ...), ready
    when all are; its workers are one slice here, numbered node by node."""
    name, accel, env, reg, slices = request.name, request.accelerator, request.env, request.registry, request.slices
    opts: CloudOptions = request.options or CloudOptions()
    _replace_gone(reg.get_slice(name))
    if compute.uses_compute(accel, opts):  # TPU7x, v6e, v5p (or --api compute): instances and MIGs
        return compute.create(request)
    if opts.flex or opts.reservation or opts.disk_size:
        flag = "flex" if opts.flex else "reservation" if opts.reservation else "disk-size"
        raise UsageError(f"--{flag} is for Compute Engine, which makes TPU7x, v6e and v5p: launch one of those without "
                         "--api tpu (the Cloud TPU API waits with --queued, and sizes the boot disk itself)")
    warm.ready()  # the SSH and Cloud TPU clients, imported where Ctrl-C cannot cut them
    from tpunb.transport import keys
    from tpunb.widgets.launch import LaunchProgress

    if slices > 1 and opts.idle_delete:
        raise UsageError("--idle-delete watches one node, not yet a multislice: launch it without --idle-delete "
                         f"and end it with %tpu_down {name}")
    project, zone = require_project_zone(opts.project, opts.zone)
    places = _places(accel, project, zone, opts.alternatives)
    key_path, public_key = keys.default_key()
    opts = colab_idle_default(opts, slices)
    if opts.internal_ip:
        _check_reaches_vpc(opts.network)
    access = logins.login(project, public_key, opts.user, service_account=opts.service_account)  # before any node exists: a refusal costs nothing
    opts = dataclasses.replace(opts, project=project, zone=places[0].zone, user=access.user,
                               queued=opts.queued or opts.race is not None)
    prepared = host_setup(opts, accel)
    spec = api.NodeSpec(**_fields(opts), name=name, accelerator=accel.name, ssh_user=access.user,
                        ssh_public_key=public_key, slices=slices, owner=access.account or logins.owner(),
                        os_login=access.os_login, prepared=prepared)
    record = SliceRecord(name=name, accelerator=accel.name, backend="gcp", state="creating", owner_pid=os.getpid(),
                         spec={**_fields(opts), **prepared, "key": str(key_path), "env_keys": sorted(env),
                               **({"os_login": True} if access.os_login else {}),
                               **({"slices": slices} if slices > 1 else {}),
                               **({TRIED: sorted({p.zone for p in places})} if len(places) > 1 else {})})
    reg.save_slice(record)  # before anything exists: even a crashed kernel leaves a trace to clean up
    kind = (f"multislice ({slices} nodes in one queued resource)" if slices > 1
            else "queued resource" if opts.queued else "node")
    price = price_per_hour(accel, opts.spot, slices)
    where = _either([p.zone for p in dict.fromkeys(places)]) if len(places) > 1 else places[0].zone
    progress = LaunchProgress(f"Launching {record.kind} {'spot ' if opts.spot else ''}{kind} {name!r} in "
                              f"{project}/{where} (backend gcp)", price)
    if (opts.queued or slices > 1) and opts.timeout is None:  # the request carries a limit either way: say which
        report.info(f"[tpunb] the queued resource waits at most {format_duration(api.DEFAULT_TIMEOUT)} for capacity "
                    f"(its valid_until_duration), then it is deleted: --timeout S changes that")
    started = time.perf_counter()
    search = failover.Search(spec, places, opts.race or 1, progress.state, opts.timeout or api.DEFAULT_TIMEOUT)
    try:
        info, spec = search.run()
    except KeyboardInterrupt:
        reg.delete_slice(name)
        message = f"launch of {name} interrupted: what it had created was deleted, nothing is left running"
        states = [o.detail for o in search.outcomes if o.kind == "cancelled" and o.detail]
        if opts.queued:  # a request that was waiting for capacity: say it is gone too
            doing = f" ({states[-1]})" if states else ""
            message = (f"launch of {name} interrupted after {format_duration(time.perf_counter() - started)}: its "
                       f"queued resource request{doing} was deleted, nothing is left running or waiting")
        progress.failed(message)
        raise CellInterrupted(message) from None
    except BaseException as exc:
        reg.delete_slice(name)
        first = (str(exc) or repr(exc)).splitlines()[0]
        progress.failed(f"failed: {first}")  # the error itself says the rest, line by line
        raise
    zone = spec.zone  # where the node is (--zone named several, or any)
    if len(places) > 1:  # the winner's place and plain options: --recover relaunches just that
        accel = catalog.lookup(spec.accelerator)
        opts = dataclasses.replace(opts, zone=zone, race=None, alternatives=None)
        record.accelerator, price = accel.name, price_per_hour(accel, opts.spot, slices)
        record.spec.update(_fields(opts))
        record.spec.pop(TRIED, None)  # the losers are gone: only the winner's zone holds anything
    node = None

    def failed(exc: BaseException) -> None:
        """A launch that could not reach or start its hosts (or was interrupted then): its node
        deleted (or kept with --keep), and said on the progress line."""
        if node is not None:
            node.close()  # its watch, also when no Slice was made of it
        if kept(opts, exc, record, reg, progress):
            return
        reg.delete_slice(name)
        deleted = api.delete_or_say(project, zone, name, "its launch could not connect to its hosts", opts.queued
                                    or slices > 1) is not None
        fate = "deleted again" if deleted else "left: see above"
        if isinstance(exc, AuthenticationError) and not access.os_login:  # metadata key refused: OS Login?
            refused = AuthenticationError(gcp_errors.os_login_message(name, project, opts.user, str(key_path)))
            progress.failed(f"could not connect to the hosts, so {name} was {fate}: {refused}")
            raise refused from None
        if isinstance(exc, HostSetupError):
            exc.args = (f"{exc}; so {name} was {fate} (--keep keeps it to look at)",)
            progress.failed(str(exc))
            return
        progress.failed(f"could not connect to the hosts, so {name} was {fate}: {exc}")

    def check(sl: Slice) -> None:
        if opts.idle_delete:  # in the start: Ctrl-C in this wait deletes the node, as it does while hosts start
            _say_idle_problem(project, zone, name)

    def ready() -> None:
        cost = f"; it costs ${price:,.2f}/hour until %tpu_down {name}" if price is not None else ""
        if opts.idle_delete:
            cost += f" or {format_duration(opts.idle_delete)} without a cell (--idle-delete)"
        tries = f" ({search.summary()})" if len(places) > 1 else ""
        progress.done(f"Slice {name!r} ready in {time.perf_counter() - started:.1f} s{tries}: {len(record.hosts)} "
                      f"host{'s' if len(record.hosts) > 1 else ''}, run cells with %%on_tpu{cost}")

    try:
        record.hosts = host_records(info, opts.internal_ip, reg)
        record.state = "running"
        node = _node(record, info)
        made = ssh.attach(record, reg, env, wait=opts.connect_wait, node=node, **jax_coordinator(record))
    except BaseException as exc:
        failed(exc)
        raise
    return dataclasses.replace(made, check=check, failed=failed, ready=ready)


def _check_reaches_vpc(network: str | None) -> None:
    """The Cloud TPU path's --internal-ip check, and where its hosts' packages then come from."""
    wanted = rest.check_reaches_vpc(network)
    report.info(f"[tpunb] --internal-ip: the hosts have no external address, so preparing them reaches PyPI and "
                f"uv's Python downloads only through Cloud NAT on network {wanted} (or use an image whose "
                f"environment is already made)")


def _say_idle_problem(project: str, zone: str, name: str, wait: float = 5.0) -> None:
    """Once the watchdog has checked it may delete the node (at arming: host 0's agent armed it as it
    started), warn if it may not; a watchdog that has not said within ``wait`` seconds says nothing."""
    deadline = time.monotonic() + wait
    try:
        while (problem := lookups.idle_problem(project, zone, name)) is None and time.monotonic() < deadline:
            api.pause(0.1)
    except Exception:  # the slice is up: a question about its watchdog must not lose it
        return
    if problem:
        report.warn(gcp_errors.idle_problem_message(name, project, problem))


def _places(accel: catalog.Accelerator, project: str, zone: str, alternatives: str | None
            ) -> list[failover.Candidate]:
    """Where to try: one zone (checked against what the API lists there, else the catalog), or
    every (type, zone) of a failover."""
    zone_list = failover.zones(accel, zone)
    if len(zone_list) == 1 and not alternatives and zone.strip().lower() != failover.ANY:
        lookups.check_offered(project, zone_list[0], accel)
        return [failover.Candidate(accel.name, zone_list[0])]
    return failover.candidates(accel, zone_list, alternatives, any_zone=zone.strip().lower() == failover.ANY)


def _either(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " or " + items[-1]


def _fields(opts: CloudOptions) -> dict:
    """The options as plain values (what the registry keeps and NodeSpec takes)."""
    return {f.name: getattr(opts, f.name) for f in dataclasses.fields(CloudOptions)}


def recorded_options(record: SliceRecord) -> CloudOptions:
    """The options a slice was launched with, from its record (for --recover)."""
    names = {f.name for f in dataclasses.fields(CloudOptions)}
    return CloudOptions(**{k: v for k, v in record.spec.items() if k in names and v is not None})


def jax_coordinator(record: SliceRecord) -> dict:
    """Where JAX's coordinator listens on a node's worker 0: on Google's API port 8476, which the
    firewall rule GCP makes for TPU pods opens (a random port hangs on a custom network, see
    docs/cloud-facts.md); the emulator's workers share one machine, so a random port each there."""
    return {"coordinator_port": None if api.endpoint() else diagnose.COORDINATOR_PORT,
            "network": record.spec.get("network"), "metadata": True}


def _node(record: SliceRecord, info: api.NodeInfo | None = None, watch: bool = True) -> CloudNode:
    spec = record.spec
    return CloudNode(record.name, record.accelerator, spec["project"], spec["zone"], bool(spec.get("spot")), info,
                     watch=watch, idle_delete=spec.get("idle_delete") or 0, queued=bool(spec.get("queued")),
                     slices=record.num_slices)


def _on_compute(record: SliceRecord) -> bool:
    """The slice was made through Compute Engine (instances, a MIG), not the Cloud TPU API."""
    return record.spec.get("api") == compute.API


def adopt(name: str, reg: Registry) -> SliceRecord | None:
    """A slice of this project no record here holds (a Colab reset): a Cloud TPU node's, else a
    Compute Engine slice's record rebuilt and saved; None when neither API has it. A Cloud TPU API
    that cannot be asked (not enabled in a project that uses only Compute Engine) is said only when
    Compute Engine has no such slice either."""
    try:
        record = adoption.adopt(name, reg)
    except ProvisionError as exc:
        if exc.reason == "lost" or not on_compute.surveyed():
            raise
        record = compute.adopt(name, reg)
        if record is None:
            raise
        return record
    if record is None and on_compute.surveyed():
        record = compute.adopt(name, reg)
    return record


def attach(record: SliceRecord, reg: Registry, env: dict[str, str]) -> Made:
    """The node's workers over SSH (agents not started); a lost node is said before any SSH error."""
    if _on_compute(record):
        return compute.attach(record, reg, env)
    if record.state == "creating" or not record.hosts:
        who = (f"kernel {record.owner_pid} is still launching it" if owner_alive(record)
               else "the kernel launching it stopped before it was ready")
        raise ProvisionError(f"{record.name!r} has no hosts yet: {who}. %tpu_status shows its node; "
                             f"%tpu_down {record.name} deletes whatever the launch created", reason="creating")
    node = _node(record)
    try:
        node.check()
        made = ssh.attach(record, reg, env, wait=adoption.connect_wait(record), node=node, **jax_coordinator(record))
    except BaseException:
        node.close()
        raise
    return dataclasses.replace(made, failed=lambda exc: node.close())


def delete(record: SliceRecord, force: bool = False) -> None:
    """Delete the node and wait until it is gone (before the registry forgets it), whoever
    attached it (``force`` changes nothing: a node is deleted from anywhere). A failover whose
    kernel died mid-launch may have left requests in each zone it tried: those go too."""
    if _on_compute(record):
        return compute.delete(record)
    _node(record, watch=False).delete()
    for zone in record.spec.get(TRIED, []):
        if zone != record.spec["zone"]:
            api.delete(record.spec["project"], zone, record.name, wait=True)


def name_reusable(record: SliceRecord) -> bool:
    """A recorded slice keeps its name while its resources may exist (and bill), until %tpu_down;
    one whose resources are gone, as its API answers now, does not block a launch of its name."""
    if record.state == "creating" and owner_alive(record):
        return False  # its launch is under way
    try:
        if _on_compute(record):
            return compute.slice_state(record) == "GONE"
        return api.get(record.spec["project"], record.spec["zone"], record.name,
                       queued=None if record.spec.get("queued") or record.num_slices > 1 else False) is None
    except Exception:  # cannot tell: the name stays taken
        return False


def _replace_gone(old: SliceRecord | None) -> None:
    """A launch takes the name of a recorded slice whose resources are gone (name_reusable): what
    its own launch left without a MIG (a template, a policy) goes, and the launch says so."""
    if old is None or old.backend != NAME:
        return
    spec = old.spec
    if _on_compute(old) and spec.get("launch"):
        compute.teardown(spec["project"], spec.get("zone"), old.name, quiet=True, vms=spec.get("vms"),
                         launch=spec["launch"])
    report.info(common.gone_record_notice(old.name, f"{spec.get('project')}/{spec.get('zone')}"))


def slice_status(record: SliceRecord, nodes: Nodes) -> SliceStatus:
    """The node's cloud state as the survey found it (its own state while not surveyed); hosts
    connected while the kernel that attached them runs; billed since the node was created."""
    place = (record.spec.get("project"), record.spec.get("zone"))
    cloud = {}
    running_s = time.time() - record.created
    if record.state == "creating":
        state = CREATING
    elif _on_compute(record):
        cloud = {"api": compute.API, "machine_type": compute.machine_type(record),
                 **compute.slice_cloud(record, nodes.get((place[0], on_compute.PLACE)))}
        state = cloud["cloud_state"]
    elif (place[0], UNREACHED) in nodes and "tpu" in nodes[(place[0], UNREACHED)]:  # its API could not be asked
        state = f"UNKNOWN ({nodes[(place[0], UNREACHED)]['tpu']})"
        cloud = {"api": api.API, "cloud_state": state}
    elif place in nodes:
        info = nodes[place].get(record.name)
        cloud = {"api": api.API, **_node(record, info, watch=False).status()}
        state = cloud["cloud_state"] or "UNKNOWN"
        running_s = cloud["uptime_s"] if cloud["uptime_s"] is not None else running_s
    else:
        state = record.state
    hosts = ssh.slice_status(record, nodes).host_states
    price = list_price(record)
    return SliceStatus(state=state, host_states=hosts, usd_per_hour=price, list_usd_per_hour=price,
                       running_s=running_s, cloud=cloud)


def recover(record: SliceRecord, reg: Registry) -> tuple[catalog.Accelerator, CloudOptions, list[str], int]:
    """Delete a lost (preempted, terminated) slice's node and forget it; what to launch again:
    its accelerator, its options, the names of its --env values (never stored) and its slices."""
    name = record.name
    report.info(f"Recovering {name!r}: deleting its lost node, then launching {record.kind} again")
    if _on_compute(record):  # its MIG, template and policy (or its instance), in order
        compute.delete(record)
    else:
        api.delete(record.spec["project"], record.spec["zone"], name, wait=True,
                   queued=bool(record.spec.get("queued")) or record.num_slices > 1)
    reg.delete_slice(name)
    return (catalog.lookup(record.accelerator), recorded_options(record), record.spec.get("env_keys", []),
            record.num_slices)


def cloud_place(record: SliceRecord) -> tuple[str | None, str | None]:
    """The project and zone the slice's node is in."""
    return record.spec.get("project"), record.spec.get("zone")


class Survey:
    """The configured project's nodes in every zone at once (adopt.everywhere: a node whose
    registry was wiped, as Colab's is, is found wherever it runs), and one list call per other
    project and zone in use; nodes a failed launch could not delete are re-checked here and
    forgotten once they are gone. The project's Compute Engine instances and MIGs are surveyed
    the same way (compute/found.py), which deletes the templates and policies left without a MIG."""

    def __init__(self, records: list[SliceRecord], reg: Registry | None = None) -> None:
        self.registry = reg or Registry()
        self.recorded = {(p, z, n): why for p, z, n, why in self.registry.orphans()}
        places = {(r.spec["project"], r.spec["zone"]) for r in records if r.backend == NAME and not _on_compute(r)}
        places |= {(p, z) for p, z, _ in self.recorded}
        project, _ = resolve_project_zone(None, None)
        self.nodes: Nodes = {}
        self.compute = None
        on_compute_here = {r.name: (r.state, r.spec.get("launch")) for r in records
                           if _on_compute(r) and r.spec.get("project") == project}

        def look(part: str):
            if part == "compute":  # instances and MIGs of every zone: their own four calls
                return on_compute.ComputeSurvey(project, on_compute_here)
            return list(adoption.everywhere(project))

        # the two APIs are asked at once: a status view waits for the slower, not for both in turn
        parts = (["compute"] if project and on_compute.surveyed() else []) + (["tpu"] if project else [])
        seen = fan_out(parts, look, deadline=None, name="tpunb-survey")
        for part, exc in seen.failed.items():  # a status view never fails on a cloud it cannot ask
            if not isinstance(exc, Exception):
                raise exc
            what = "Compute Engine resources" if part == "compute" else "nodes"
            why = str(exc) if isinstance(exc, TpunbError) else f"{type(exc).__name__}: {exc}"
            self.nodes.setdefault((project, UNREACHED), {})[part] = gcp_errors.one_line(why, 160)
            report.warn(f"[tpunb] cannot list the {what} of {project}: {why}")
        if "compute" in seen.succeeded:
            self.compute = seen.succeeded["compute"]
            self.nodes[(project, on_compute.PLACE)] = self.compute.found  # what slice_status reads: no call per slice
        if "tpu" in seen.succeeded:
            for info in seen.succeeded["tpu"]:
                self.nodes.setdefault((project, info.zone), {})[info.name] = info
            for place in [p for p in places if p[0] == project]:  # listed: none there is an answer too
                self.nodes.setdefault(place, {})
            places = {p for p in places if p[0] != project}
        for place in sorted(places):
            try:
                self.nodes[place] = {info.name: info for info in api.list_nodes(*place)}
            except TpunbError as exc:
                report.warn(f"[tpunb] cannot list nodes in {place[0]}/{place[1]}: {exc}")

    def refresh(self, record: SliceRecord, node: Node | None) -> None:
        """Give an attached slice's node what the survey saw of it (one list call covers a zone)."""
        place = (record.spec.get("project"), record.spec.get("zone"))
        if isinstance(node, CloudNode) and place in self.nodes:
            node.update(self.nodes[place].get(record.name))

    def orphans(self, known: set[str]) -> list[OrphanStatus]:
        """tpunb nodes the registry does not hold as slices: still billed, deletable here."""
        found = []
        for (project, zone), nodes in self.nodes.items():
            if zone in (on_compute.PLACE, UNREACHED):  # Compute Engine's own, below; an API not listed
                continue
            for node_name, info in sorted(nodes.items()):
                if node_name in known or not info.tpunb_owned:
                    continue
                why = self.recorded.get((project, zone, node_name))
                message = (f"{why}; still billed: delete it here, with %tpu_down {node_name} or "
                           f"{api.delete_command(project, zone, node_name, info.queued_resource is not None)}"
                           if why else
                           f"not in this registry and still billed: %tpu_use {node_name} re-attaches it, "
                           f"%tpu_down {node_name} deletes it")
                found.append(self._orphan(project, zone, node_name, info, message))
        if self.compute is not None:
            found += self.compute.orphans(known)
        for (project, zone, node_name), why in self.recorded.items():
            if (project, zone) not in self.nodes:  # not listed now: say what is known, check again later
                found.append(self._orphan(project, zone, node_name, None, f"{why}; %tpu_down {node_name} deletes it"))
            elif node_name not in self.nodes[(project, zone)]:
                self.registry.forget_orphan(project, zone, node_name)  # gone since: nothing bills any more
        return found

    @staticmethod
    def _orphan(project: str, zone: str, name: str, info: api.NodeInfo | None, message: str) -> OrphanStatus:
        if info is None:
            return OrphanStatus(name=name, accelerator="", num_slices=1, project=project, zone=zone, state="UNKNOWN",
                                spot=False, usd_per_hour=None, uptime_s=None, message=message,
                                cloud={"api": api.API, "cloud_state": "UNKNOWN"}, backend=NAME)
        node = CloudNode(name, info.accelerator, project, zone, info.spot, info, watch=False, slices=info.slices)
        cloud = {"api": api.API, **node.status()}
        return OrphanStatus(name=name, accelerator=info.kind, num_slices=info.slices, project=project, zone=zone,
                            state=cloud["cloud_state"], spot=info.spot, usd_per_hour=cloud["usd_per_hour"],
                            uptime_s=cloud["uptime_s"], message=message, cloud=cloud, backend=NAME)


survey = Survey  # the capability's member: survey(records, reg)


def delete_orphan(name: str, reg: Registry | None = None) -> bool:
    """A tpunb node the registry does not hold as a slice (in any zone of the configured project,
    or recorded as left by a failed launch): delete it."""
    reg = reg or Registry()
    places = [(p, z) for p, z, n, _ in reg.orphans() if n == name]
    project, _ = resolve_project_zone(None, None)
    found = adoption.find(project, name) if project else None
    if found is not None:
        places.append((project, found.zone))
    for place in dict.fromkeys(places):
        info = api.get(*place, name)
        if info is not None and info.tpunb_owned and api.delete(*place, name, wait=True):
            reg.forget_orphan(*place, name)
            return True
        if info is None:
            reg.forget_orphan(*place, name)
    return bool(project and on_compute.surveyed() and on_compute.delete_orphan(project, name))  # instances, MIGs, leftovers
