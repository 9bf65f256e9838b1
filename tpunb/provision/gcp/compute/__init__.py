"""Cloud TPU slices through Compute Engine, the API Google builds TPUs on from TPU7x (Ironwood) on:
a one-host slice is an instance of a TPU machine type, a multi-host one a zonal MIG whose VMs are
made at once (BULK) under a workload policy that names the topology. The slice is recorded as
backend ``gcp`` with ``api: compute``; every other part of tpunb treats it as any cloud slice.

``create`` makes the resources in order (policy, template, MIG; or the instance), waits until the
slice is up (docs/cloud-facts.md: the MIG stable, its topology ACTIVE, every VM RUNNING with no
current action), reaches every VM over SSH and numbers the hosts by the worker id each VM's
metadata gives (never the MIG's list order); JAX gets its process id and coordinator from tpunb.
Whatever fails or is interrupted deletes what was made, in order: MIG, template, policy.
"""
from __future__ import annotations

import dataclasses
import os
import time
from typing import TYPE_CHECKING

from tpunb import catalog, diagnose, report
from tpunb.errors import CellInterrupted, ProvisionError, TpunbError, UsageError
from tpunb.engine import programs
from tpunb.provision import ssh, warm
from tpunb.provision.base import LaunchRequest, Made
from tpunb.provision.gcp import api, logins
from tpunb.provision.gcp.compute import clients
from tpunb.provision.gcp.compute.bodies import Names, VmSpec, instance, mig, template, workload_policy
from tpunb.provision.gcp.compute.node import ComputeNode
from tpunb.provision.gcp.config import CloudOptions, require_project_zone
from tpunb.provision.gcp.prepare import host_setup
from tpunb.registry import HostInfo, HostRecord, Registry, SliceRecord

if TYPE_CHECKING:
    from tpunb.transport.base import Transport

API = "compute"
#: options that only the Cloud TPU API has: under Compute Engine each is one line saying so
TPU_API_ONLY = {"queued": "--queued (queued resources)", "race": "--race (queued resources in several zones)",
                "runtime": "--runtime (Compute Engine VMs boot an image family, not a TPU runtime)",
                "alternatives": "--alternatives", "idle_delete": "--idle-delete (so far)"}
SSH_PORT_LABEL = "tpunb-ssh-port"  # the sandbox's sshd, when not on port 22 (as on the Cloud TPU side)


def uses_compute(accel: catalog.Accelerator, opts: CloudOptions) -> bool:
    """Whether Compute Engine makes this slice: --api, else the type's default (TPU7x, v6e, v5p)."""
    chosen = opts.api or accel.default_api
    if chosen == "tpu":
        catalog.check_launchable(accel)  # planning only, or only Compute Engine makes it: one line
    if chosen == API:
        catalog.compute_shape(accel)  # a type Compute Engine does not make: one line, with what to do
    return chosen == API


def check_options(opts: CloudOptions, slices: int, zone: str) -> None:
    """What means nothing (or nothing yet) under Compute Engine is refused before anything is made."""
    given = [what for field, what in TPU_API_ONLY.items() if getattr(opts, field)]
    if slices > 1:
        given.insert(0, "--slices (a multislice)")
    if given:
        raise UsageError(f"{given[0]} is for the Cloud TPU API: add --api tpu (for a type it makes: v2-v5e, v4, v5p, "
                         "v6e), or launch without it")
    if "," in zone or zone.strip().lower() == "any":
        raise UsageError(f"--zone {zone}: through Compute Engine tpunb launches in one zone so far; name one")


def create(request: LaunchRequest) -> Made:
    """Make the slice's VMs through Compute Engine and reach them; see the module's docstring."""
    name, accel, env, reg = request.name, request.accelerator, request.env, request.registry
    opts: CloudOptions = request.options or CloudOptions()
    warm.ready()
    from tpunb.transport import keys
    from tpunb.widgets.launch import LaunchProgress

    project, zone = require_project_zone(opts.project, opts.zone)
    check_options(opts, request.slices, zone)
    shape = catalog.compute_shape(accel)
    if zone not in shape.zones:
        raise UsageError(f"{zone} has no {shape.machine_type} ({accel.name}): zones with it: {', '.join(shape.zones)}")
    key_path, public_key = keys.default_key()
    access = logins.login(project, public_key, opts.user)
    prepared = host_setup(opts)
    user = access.user or "tpunb"
    vm = VmSpec(name, shape, zone, access.account or logins.owner(), user, public_key, access.os_login, opts.spot,
                opts.internal_ip, opts.network, opts.subnetwork, opts.service_account, tuple(opts.labels.items()))
    fields = {f.name: getattr(opts, f.name) for f in dataclasses.fields(CloudOptions)}
    record = SliceRecord(name=name, accelerator=accel.name, backend="gcp", state="creating", owner_pid=os.getpid(),
                         spec={**fields, **prepared, "api": API, "project": project, "zone": zone, "user": user,
                               "key": str(key_path), "env_keys": sorted(env), "vms": shape.vms,
                               **({"os_login": True} if access.os_login else {})})
    reg.save_slice(record)  # before anything exists: even a crashed kernel leaves a trace to clean up
    what = f"{shape.vms} x {shape.machine_type} (a MIG, topology {shape.topology})" if shape.multi_host \
        else f"one {shape.machine_type}"
    progress = LaunchProgress(f"Launching {accel.name} {'spot ' if opts.spot else ''}{name!r} through Compute Engine "
                              f"in {project}/{zone}: {what}", None)
    started = time.perf_counter()
    deadline = time.monotonic() + (opts.timeout or api.DEFAULT_TIMEOUT)
    try:
        _make(project, vm, progress.state, deadline)
        hosts = made_hosts(project, zone, name, shape.multi_host, opts.internal_ip)
    except BaseException as exc:
        left = teardown(project, zone, name)
        reg.delete_slice(name)
        if isinstance(exc, KeyboardInterrupt):
            message = f"launch of {name} interrupted: what it had created was deleted{left or ', nothing is left'}"
            progress.failed(message)
            raise CellInterrupted(message) from None
        progress.failed(f"failed: {(str(exc) or repr(exc)).splitlines()[0]}{left}")
        raise
    record.hosts, record.state = hosts, "running"
    return _reach(record, reg, env, opts, progress, started)


def _make(project: str, vm: VmSpec, say, deadline: float) -> None:
    """The resources, in order, each waited for; then until the slice is up (whatever stops it part
    way, ``teardown`` deletes what exists)."""
    c, region = clients.clients(), catalog.region_of(vm.zone)

    def create(what: str, insert, **where) -> None:
        say(f"creating its {what}", 0.0)
        clients.wait(project, clients.call(f"create the {what}", insert, project=project, **where), f"create the {what}",
                     deadline)

    if vm.shape.multi_host:
        create("workload policy", c.policies.insert_unary, region=region, resource_policy_resource=workload_policy(vm))
        create("instance template", c.templates.insert_unary, region=region, instance_template_resource=template(vm))
        create(f"MIG of {vm.shape.vms} VMs", c.migs.insert_unary, zone=vm.zone,
               instance_group_manager_resource=mig(vm, project))
        _wait_up(project, vm.zone, vm.name, say, deadline)
    else:
        create("VM", c.instances.insert_unary, zone=vm.zone, instance_resource=instance(vm))
        _wait_running(project, vm.zone, vm.name, say, deadline)


def _wait_running(project: str, zone: str, name: str, say, deadline: float) -> None:
    c = clients.clients()
    for delay in api.poll_delays():
        status = clients.call("read the VM", c.instances.get, project=project, zone=zone, instance=name).status
        say(f"VM {status}", 0.0)
        if status == "RUNNING":
            return
        if status in ("TERMINATED", "STOPPED", "SUSPENDED") or time.monotonic() > deadline:
            raise ProvisionError(f"the VM {name} is {status}, not RUNNING", reason="failed")
        api.pause(delay)


def _wait_up(project: str, zone: str, name: str, say, deadline: float) -> None:
    """Until the MIG is stable, its topology ACTIVE and every VM RUNNING with no current action;
    past the deadline, one line with what the MIG's listErrors say."""
    c = clients.clients()
    for delay in api.poll_delays():
        group = clients.call("read the MIG", c.migs.get, project=project, zone=zone, instance_group_manager=name)
        vms = list(clients.call("list the MIG's VMs", c.migs.list_managed_instances, project=project, zone=zone,
                                instance_group_manager=name))
        topology = [t.state for t in group.status.applied_accelerator_topologies]
        running = sum(v.instance_status == "RUNNING" and v.current_action == "NONE" for v in vms)
        say(f"{running}/{group.target_size} VMs running, topology {'/'.join(topology) or 'pending'}", 0.0)
        if group.status.is_stable and topology == ["ACTIVE"] and running == group.target_size == len(vms):
            return
        if time.monotonic() > deadline:
            errors = list(clients.call("read the MIG's errors", c.migs.list_errors, project=project, zone=zone,
                                       instance_group_manager=name))
            why = "; ".join(e.error.message for e in errors[:3] if e.error) or "no errors listed"
            raise ProvisionError(f"the MIG {name} did not become stable in time: {why}", reason="timeout")
        api.pause(delay)


def made_hosts(project: str, zone: str, name: str, multi_host: bool, internal_ip: bool) -> list[HostRecord]:
    """The slice's VMs as host records, in the MIG's list order for now (``_reach`` renumbers them by
    worker id): the address to connect to, the sshd's port, the internal IP JAX's coordinator uses."""
    c = clients.clients()
    if multi_host:
        urls = [v.instance for v in clients.call("list the MIG's VMs", c.migs.list_managed_instances, project=project,
                                                 zone=zone, instance_group_manager=name)]
        names = [u.rsplit("/", 1)[-1] for u in urls]
    else:
        names = [name]
    hosts = []
    for i, vm_name in enumerate(names):
        vm = clients.call("read a VM", c.instances.get, project=project, zone=zone, instance=vm_name)
        nic = vm.network_interfaces[0]
        external = next((a.nat_i_p for a in nic.access_configs if a.nat_i_p), None)
        address = nic.network_i_p if internal_ip or not external else external
        port = int(vm.labels.get(SSH_PORT_LABEL, 22) or 22)
        hosts.append(HostRecord(i, address if port == 22 else f"{address}:{port}",
                                HostInfo(internal_ip=nic.network_i_p, extra={"instance": vm_name})))
    return hosts


def _reach(record: SliceRecord, reg: Registry, env: dict[str, str], opts: CloudOptions, progress, started: float) -> Made:
    """SSH to every VM, number the hosts by their worker ids, and hand the slice to the manager;
    a failure on the way deletes what the launch made."""
    project, zone, name = record.spec["project"], record.spec["zone"], record.name

    def failed(exc: BaseException) -> None:
        reg.delete_slice(name)
        left = teardown(project, zone, name)
        progress.failed(f"could not reach or start the hosts, so {name} was deleted{left}: {exc}")

    try:
        transports = ssh.connect_hosts(record, reg, opts.connect_wait)
        order = worker_order(transports)
        record.hosts = [dataclasses.replace(record.hosts[i], index=n) for n, i in enumerate(order)]
        transports = [transports[i] for i in order]
        reg.save_slice(record)
        made = ssh.attach(record, reg, env, coordinator_port=None if clients.endpoint() else diagnose.COORDINATOR_PORT,
                          network=opts.network, transports=transports, node=node(record))
    except BaseException as exc:
        failed(exc)
        raise

    def ready() -> None:
        progress.done(f"Slice {name!r} ready in {time.perf_counter() - started:.1f} s through Compute Engine: "
                      f"{len(record.hosts)} host{'s' if len(record.hosts) > 1 else ''}, run cells with %%on_tpu; it "
                      f"bills until %tpu_down {name}")

    return dataclasses.replace(made, failed=failed, ready=ready)


def worker_order(transports: list["Transport"]) -> list[int]:
    """The transports' positions sorted by the worker id each VM's metadata gives."""
    from tpunb.engine.bundle import worker_source

    def worker(reply: dict, t: "Transport") -> int:
        if reply.get("worker") is None:
            raise ProvisionError(f"the VM at {t.address} has no worker-id (nor TPU_WORKER_ID in tpu-env) in its "
                                 "metadata: is it a TPU VM?", reason="failed")
        return int(reply["worker"])

    asked = programs.ask_hosts({i: programs.Program(t, [t.python, "-c", worker_source()], {}, "reading the VM's worker id")
                                for i, t in enumerate(transports)}, deadline=60.0, name="tpunb-worker-ids")
    ids = [worker(reply, transports[i]) for i, reply in enumerate(asked.values())]
    if sorted(ids) != list(range(len(ids))):
        raise ProvisionError(f"the VMs' worker ids are {sorted(ids)}, not 0-{len(ids) - 1}: the slice is not whole",
                             reason="failed")
    return sorted(range(len(ids)), key=lambda i: ids[i])


def attach(record: SliceRecord, reg: Registry, env: dict[str, str]) -> Made:
    """The slice's VMs again (agents not started), in the worker order the launch recorded."""
    if record.state == "creating" or not record.hosts:
        raise ProvisionError(f"{record.name!r} has no hosts yet: its launch did not finish. %tpu_down {record.name} "
                             "deletes whatever it created", reason="creating")
    coordinator = None if clients.endpoint() else diagnose.COORDINATOR_PORT
    return ssh.attach(record, reg, env, wait=30.0, coordinator_port=coordinator, network=record.spec.get("network"),
                      node=node(record))


def node(record: SliceRecord) -> ComputeNode:
    """The slice's cloud side, for an attached Slice: deleted in order by %tpu_down."""
    from tpunb.provision.gcp.node import list_price

    return ComputeNode(record, delete, list_price(record))


def delete(record: SliceRecord) -> None:
    """Delete the slice's resources in order and wait until they are gone; what could not be
    deleted is one error listing the gcloud commands for it."""
    spec = record.spec
    left = teardown(spec["project"], spec["zone"], record.name, quiet=True)
    if left:
        raise ProvisionError(f"could not delete all of {record.name}{left}", reason="delete")


def teardown(project: str, zone: str, name: str, quiet: bool = False) -> str:
    """Delete whatever exists of slice ``name``: the MIG (or the instance), then the template, then the
    policy (a template or policy in use cannot go before its MIG). "" when nothing is left, else
    the text that says what is left and the gcloud commands that delete it."""
    from google.api_core import exceptions

    c, names, region = clients.clients(), Names(name), catalog.region_of(zone)
    steps = [
        (f"gcloud compute instance-groups managed delete {name} --zone {zone}",
         lambda: c.migs.delete_unary(project=project, zone=zone, instance_group_manager=name)),
        (f"gcloud compute instances delete {name} --zone {zone}",
         lambda: c.instances.delete_unary(project=project, zone=zone, instance=name)),
        (f"gcloud compute instance-templates delete {names.template} --region {region}",
         lambda: c.templates.delete_unary(project=project, region=region, instance_template=names.template)),
        (f"gcloud compute resource-policies delete {names.policy} --region {region}",
         lambda: c.policies.delete_unary(project=project, region=region, resource_policy=names.policy)),
    ]
    left: list[str] = []
    for command, delete_it in steps:
        if left:  # an earlier step failed: what depends on it cannot go either
            left.append(command)
            continue
        try:
            clients.wait(project, clients.call(f"delete ({command})", delete_it), f"delete ({command})")
        except exceptions.NotFound:
            continue
        except TpunbError as exc:
            left.append(command)
            if not quiet:
                report.warn(f"[tpunb] {exc}")
    if not left:
        return ""
    return "; still there, delete with: " + "; ".join(left)


def slice_state(record: SliceRecord) -> str:
    """The slice's state as Compute Engine has it: its MIG's (or instance's), or GONE."""
    from google.api_core import exceptions

    c, spec = clients.clients(), record.spec
    try:
        if int(spec.get("vms") or 1) > 1:
            group = c.migs.get(project=spec["project"], zone=spec["zone"], instance_group_manager=record.name)
            return "READY" if group.status.is_stable else "CHANGING"
        return c.instances.get(project=spec["project"], zone=spec["zone"], instance=record.name).status
    except exceptions.NotFound:
        return "GONE"
    except Exception as exc:  # a status view never fails on one slice
        return f"unknown ({type(exc).__name__})"


__all__ = ["API", "attach", "create", "delete", "slice_state", "teardown", "uses_compute"]
