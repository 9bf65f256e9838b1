"""Cloud TPU slices through Compute Engine, the API Google builds TPUs on from TPU7x (Ironwood) on:
a one-host slice is an instance of a TPU machine type, a multi-host one a zonal MIG whose VMs are
made at once (BULK) under a workload policy that names the topology. The slice is recorded as
backend ``gcp`` with ``api: compute``; every other part of tpunb treats it as any cloud slice.

``create`` makes the resources in order (policy, template, MIG; or the instance), waits until the
slice is up (docs/cloud-facts.md: the MIG stable, its topology ACTIVE, every VM RUNNING with no
current action), reaches every VM over SSH and numbers the hosts by the worker id each VM's
metadata gives (never the MIG's list order); JAX gets its process id and coordinator from tpunb.
Whatever fails or is interrupted deletes what was made, in order: MIG, template, policy.

The zones are Compute Engine's own answer (zones.py); with several, each is tried in turn and a
zone that refuses for capacity, quota or time is left empty first. ``--flex HOURS`` waits for
flex-start capacity (a PENDING VM, or a BULK MIG made empty and resized), ``--reservation NAME``
consumes a reservation. make.py makes one zone's resources and waits until they are up, found.py
finds tpunb's resources for the survey, delete.py deletes them, adopt.py re-attaches a slice no
registry here holds (a Colab reset).
"""
from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import TYPE_CHECKING

from tpunb.provision.gcp import apis
from tpunb import catalog, diagnose
from tpunb.errors import (AuthenticationError, HostKeyError, HostSetupError, ProvisionError,
                          TpunbError, UsageError)
from tpunb.engine import programs
from tpunb.provision import ssh, warm
from tpunb.provision.base import LaunchRequest, Made
from tpunb.provision.gcp import logins
from tpunb.provision.gcp import shared
from tpunb.provision.gcp.shared import LAUNCH_LABEL, NAME_LIMIT, new_launch, same_launch
from tpunb.provision.gcp.compute import adopt as adoption, clients, fallback, hostkeys, network, org_policy, preflight
from tpunb.provision.gcp.compute.bodies import VmSpec
from tpunb.provision.gcp.compute.delete import teardown
from tpunb.provision.gcp.compute.bulk import activation_limit
from tpunb.provision.gcp.compute.make import WAITING, make_resources
from tpunb.provision.gcp.compute.compute_node import ComputeNode
from tpunb.provision.gcp.compute.zones import ZONE_FAILURES, choose, everywhere_failed, outcome
from tpunb.provision.gcp.config import (CloudOptions, colab_idle_default, format_duration, require_project_zone,
                                       resolve_project_zone)
from tpunb.provision.gcp.vm_setup import host_setup, kept
from tpunb.provision.gcp.shared import NAME_LABEL, SSH_PORT_LABEL, Candidate, Outcome, label_value, price_per_hour
from tpunb.registry import HostInfo, HostRecord, Registry, SliceRecord

if TYPE_CHECKING:
    from tpunb.transport.seam import Transport

API = "compute"
#: options that mean nothing (or nothing yet) under Compute Engine: what each is, and what to do there instead
TPU_API_ONLY = {
    "queued": ("--queued (queued resources)", "--flex HOURS waits for flex-start capacity instead"),
    "race": ("--race (queued resources raced in several zones at once)",
             "zones are tried one at a time, each left empty before the next: drop --race and name them with "
             "--zone Z1,Z2 (or --zone any)"),
    "runtime": ("--runtime (a TPU software version)",
                "Compute Engine VMs boot Google's TPU image for the type and tpunb makes the JAX environment: drop "
                "--runtime (--jax V picks the jax version)"),
    "alternatives": ("--alternatives (other types to try)", "launch the other type yourself if this one fails"),
}
#: how long a new slice's VMs may take to answer SSH once Compute Engine says RUNNING: a first boot
#: of 12 minutes is on record (marin#7030); a VM deleted or stopped meanwhile ends the wait at once
FIRST_BOOT_WAIT = 15 * 60.0
#: what a flex-start slice's cost says: no source tpunb can cite gives the flex-start rate (docs/cloud-facts.md)
FLEX_PRICE = "flex-start price not known"


def uses_compute(accel: catalog.Accelerator, opts: CloudOptions) -> bool:
    """Whether Compute Engine makes this slice: --api, else the type's default (TPU7x, v6e, v5p)."""
    chosen = opts.api or apis.default_api(accel)
    if chosen == "tpu":
        apis.check_tpu_api(accel)  # planning only, or only Compute Engine makes it: one line
    if chosen == API:
        apis.compute_shape(accel)  # a type Compute Engine does not make: one line, with what to do
    return chosen == API


def check_options(opts: CloudOptions, slices: int, accel: catalog.Accelerator | None = None) -> None:
    """What means nothing (or nothing yet) under Compute Engine is refused before anything is made,
    in one line: what the option is, what to do under Compute Engine, and ``--api tpu`` where the
    Cloud TPU API makes the type (never for TPU7x)."""
    given = [TPU_API_ONLY[name] for name in TPU_API_ONLY if getattr(opts, name)]
    if slices > 1:
        given.insert(0, ("--slices (a multislice)", "launch one slice"))
    if given:
        what, instead = given[0]
        other = "" if accel is not None and apis.no_tpu_api(accel) else \
            "; or add --api tpu (the Cloud TPU API makes v2-v5e, v4, v5p, v6e)"
        raise UsageError(f"{what} is for the Cloud TPU API: under Compute Engine {instead}{other}")


class Plan:
    """A Compute Engine launch, checked and prepared before anything exists (the reservation, the
    network, the logins, the zones): the driver's verbs (tpunb.provision.launching.Plan)."""

    def __init__(self, request: LaunchRequest, opts: CloudOptions) -> None:
        from tpunb.transport import keys

        name, accel, env = request.name, request.accelerator, request.env
        warm.ready(*warm.LAUNCH_MODULES, *warm.COMPUTE_MODULES)  # google-cloud-compute too, where Ctrl-C cannot cut it
        project, default_zone = resolve_project_zone(opts.project, None)
        if project is None:
            require_project_zone(None, "-")  # the one line saying how to set a project
        check_options(opts, request.slices, accel)
        opts = colab_idle_default(opts, request.slices)
        shape = apis.compute_shape(accel)
        if len(name) > NAME_LIMIT and (shape.multi_host or opts.flex):  # a flex v6e-8 may become a MIG (fallback.py)
            raise UsageError(f"slice name {name!r} has {len(name)} characters: a multi-host slice's name has at most "
                             f"{NAME_LIMIT} (its workload policy is NAME-tpunb-wp, at most 63): give a shorter --name")
        zones = choose(project, shape, opts.zone, default_zone)
        key_path, public_key = keys.default_key()
        self.pre = pre = preflight.run(project, opts, zones, public_key)  # before anything exists
        zones, access = pre.zones, pre.access
        prepared = host_setup(opts, accel)  # the generation's minimum jax and libtpu, or one line
        user = access.user or "tpunb"
        launch = new_launch()  # on every resource this launch makes: only those are ever deleted by it
        self.vm = VmSpec(name, shape, zones[0], access.account or logins.owner(), user, public_key, access.os_login,
                         opts.spot, opts.internal_ip, opts.network, pre.subnetwork, opts.service_account,
                         tuple(opts.labels.items()), opts.flex, int(min(max(opts.timeout or 7200, 90), 7200)),
                         pre.reservation.affinity_value(project) if pre.reservation else None,
                         json.dumps({"user": user, "os_login": access.os_login, "python": opts.python,
                                     "network": opts.network, "service_account": opts.service_account, **prepared},
                                    sort_keys=True),
                         project, float(opts.idle_delete or 0), boot_grace(shape, opts), launch,
                         reservation_bound=bool(pre.reservation and pre.reservation.bound),
                         disk_size=opts.disk_size or 200)
        fields = {f.name: getattr(opts, f.name) for f in dataclasses.fields(CloudOptions)}
        self.record = SliceRecord(
            name=name, accelerator=accel.name, backend="gcp", state="creating", owner_pid=os.getpid(),
            spec={**fields, **prepared, "api": API, "project": project, "zone": zones[0], "user": user,
                  "key": str(key_path), "env_keys": sorted(env), "vms": shape.vms, "launch": launch,
                  **({"os_login": True} if access.os_login else {})})
        self.opts, self.zones, self.project, self.registry = opts, zones, project, request.registry
        self.accelerator, self.shape, self.tries, self.watched = accel.name, shape, "", []
        devices = f"{accel.chips} chips, {accel.devices} JAX devices"  # TPU7x: 2 per chip (catalog devices_per_chip)
        what = (f"{shape.vms} x {shape.machine_type} (a MIG, topology {shape.topology}, {devices})" if shape.multi_host
                else f"one {shape.machine_type} ({devices})")
        where = zones[0] if len(zones) == 1 else ", ".join(zones[:-1]) + " or " + zones[-1]
        how = "spot " if opts.spot else f"flex-start ({opts.flex:g} h) " if opts.flex else ""
        using = f", from reservation {opts.reservation}" if opts.reservation else ""
        self.price = None if opts.flex else price_per_hour(accel, opts.spot)  # TPU7x, flex-start: no source gives one
        self.unpriced = FLEX_PRICE if opts.flex else "price unknown"
        self.title = (f"Launching {accel.name} {how}{name!r} through Compute Engine in {project}/{where}: "
                      f"{what}{using}")
        self.notes: list[str] = []

    def make(self, progress) -> None:
        record, vm = self.record, self.vm
        try:
            hosts, tried = first_granted(self.project, vm, self.zones, record, self.registry, progress.state, self.opts)
        except ProvisionError as exc:
            self.vm = vm = fallback.flex_alternative(vm, exc)  # a flex-start v6e-8's 8t refused: its 8 chips as 2 x 4t
            if vm is None:
                raise
            progress.state(f"{self.shape.machine_type} refused under "
                           f"flex-start ({str(exc).splitlines()[0]}): trying {vm.shape.vms} x {vm.shape.machine_type} "
                           f"(a MIG, topology {vm.shape.topology})", 0.0)
            record.spec["vms"] = vm.shape.vms
            self.registry.save_slice(record)
            hosts, tried = first_granted(self.project, vm, self.zones, record, self.registry, progress.state, self.opts)
        record.hosts, self.tries = hosts, "; ".join(str(o) for o in tried)

    def undo(self, exc: BaseException) -> str:
        if isinstance(exc, TpunbError):
            return ""  # first_granted left each zone it tried empty
        return teardown(self.project, self.record.spec["zone"], self.record.name, vms=self.record.spec["vms"],
                        launch=self.vm.launch)

    def waiting(self, progress) -> str | None:
        if not self.opts.flex:
            return None
        waited = " (it was waiting for capacity)" if progress.steps and WAITING in progress.steps[-1][0] else ""
        return f"its flex-start request{waited}"

    def explain(self, exc: BaseException) -> None:
        preflight.explain(exc, self.pre, self.accelerator, self.project, len(self.zones))

    def reach(self, env: dict[str, str]) -> Made:
        return _reach(self.record, self.registry, env, self.opts, self.watched)

    def close(self) -> None:
        for made_node in self.watched:
            made_node.close()

    def delete(self) -> str:
        spec = self.record.spec
        return teardown(self.project, spec["zone"], self.record.name, vms=spec.get("vms"), launch=spec.get("launch"))

    def refused(self, exc: BaseException) -> BaseException | None:
        spec = self.record.spec
        if isinstance(exc, AuthenticationError) and not spec.get("os_login"):  # the metadata key refused
            return AuthenticationError(org_policy.os_login_refusal(self.record.name, self.project, spec["user"],
                                                                   spec["key"], self.pre.org_os_login))
        return None

    def setup_hint(self, exc: HostSetupError) -> str:
        return network.egress_hint(self.pre.egress) if "no route to the package index" in str(exc) else ""

    def keep(self, exc: BaseException, progress) -> bool:
        return kept(self.opts, exc, self.record, self.registry, progress)

    def check(self, sl) -> None:
        # the watchdog armed as host 0 started (--idle-delete), or at boot (grace-only: its check is
        # written by now, else waited for briefly): say at once if it may not delete the slice
        sl.node.say_idle_problem(5.0 if self.opts.idle_delete else 2.0)

    def ready(self, seconds: float) -> str:
        name, hosts, opts = self.record.name, self.record.hosts, self.opts
        idle = f" or {format_duration(opts.idle_delete)} without a cell (--idle-delete)" if opts.idle_delete else ""
        return (f"Slice {name!r} ready in {seconds:.1f} s through Compute Engine"
                f"{f' ({self.tries})' if self.tries else ''}: {len(hosts)} host{'s' if len(hosts) > 1 else ''}, run "
                f"cells with %%on_tpu; it bills until %tpu_down {name}{idle}")


def plan(request: LaunchRequest, opts: CloudOptions) -> Plan:
    """A Compute Engine launch checked and prepared, for the launch driver."""
    return Plan(request, opts)


def first_granted(project: str, vm: VmSpec, zones: list[str], record: SliceRecord, reg: Registry, say,
                   opts: CloudOptions) -> tuple[list[HostRecord], list]:
    """Make the slice in each zone in turn until one grants it; a zone that refuses for capacity,
    quota or time is left with nothing in it (a quota refusal skips its region's other zones:
    quotas are regional). The hosts, and each zone's outcome when there were several."""
    outcomes, skipped = [], set()
    for i, zone in enumerate(zones):
        if catalog.region_of(zone) in skipped:
            outcomes.append(Outcome(Candidate(vm.shape.accelerator, zone), "skipped",
                                    f"the quota of {catalog.region_of(zone)} is exhausted"))
            continue
        limit = _wait_limit(vm, opts)  # a MIG still waiting past its deadline is no launch's: a survey deletes it
        here = dataclasses.replace(vm, zone=zone, deadline=time.time() + limit + activation_limit(vm.shape.vms)
                                   + opts.connect_wait)
        record.spec["zone"] = zone
        reg.save_slice(record)  # where its resources are now: %tpu_down from another kernel finds them
        prefixed = _changes(say, "" if len(zones) == 1 else f"{zone}: ")
        try:
            make_resources(project, here, prefixed, time.monotonic() + limit, more_zones=i < len(zones) - 1)
            hosts = made_hosts(project, zone, vm.name, vm.shape.multi_host, opts.internal_ip, vm.launch)
        except BaseException as exc:
            left = teardown(project, zone, vm.name, vms=vm.shape.vms, launch=vm.launch)  # what it made: nothing stays
            if left and isinstance(exc, TpunbError):
                exc.args = (f"{exc}{left}",)
            if left or len(zones) == 1 or not isinstance(exc, ProvisionError) or exc.reason not in ZONE_FAILURES:
                raise  # never a second zone while this one still holds something
            outcomes.append(outcome(vm.shape.accelerator, zone, exc))
            say(str(outcomes[-1]), 0.0)
            if exc.reason == "quota":
                skipped.add(catalog.region_of(zone))
            continue
        if len(zones) > 1:
            outcomes.append(Outcome(Candidate(vm.shape.accelerator, zone), "granted"))
        return hosts, outcomes
    raise everywhere_failed(vm.name, project, outcomes, vm.spot)


def boot_grace(shape: apis.ComputeShape, opts: CloudOptions) -> float:
    """How long after boot worker 0's watchdog waits for the launching kernel to say its launch is
    done: the slice's activation (its topology may become ACTIVE long after the VMs boot), then the
    kernel's connect wait; a kernel preparing the hosts marks activity, which extends it."""
    return activation_limit(shape.vms) + float(opts.connect_wait) if shape.multi_host else float(opts.connect_wait)


def _wait_limit(vm: VmSpec, opts: CloudOptions) -> float:
    """How long one zone may take: --timeout, else 20 minutes, or for flex-start 2 hours (a single
    VM's requestValidForDuration, and a minute for its expiry to show)."""
    if vm.flex_hours and not vm.shape.multi_host:
        return vm.flex_wait + 60.0
    return opts.timeout or (7200.0 if vm.flex_hours else shared.DEFAULT_TIMEOUT)


def _changes(say, prefix: str):
    """``say`` for each new state only (polls repeat them), with the seconds since the first."""
    started, last = time.monotonic(), []

    def tell(text: str, _elapsed: float = 0.0) -> None:
        if not last or last[-1] != text:
            last.append(text)
            say(prefix + text, time.monotonic() - started)

    return tell


def made_hosts(project: str, zone: str, name: str, multi_host: bool, internal_ip: bool,
               launch: str | None = None) -> list[HostRecord]:
    """The slice's VMs as host records, in the MIG's list order for now (``_reach`` renumbers them by
    worker id): the address to connect to, the sshd's port, the internal IP JAX's coordinator uses.
    ``launch``: the slice's token; VMs of another launch of the same name are never taken."""
    c = clients.clients()
    if multi_host:  # the MIG's VMs, then all of them in one list call (one get each took a round trip each)
        urls = [v.instance for v in clients.call("list the MIG's VMs", c.migs.list_managed_instances, project=project,
                                                 zone=zone, instance_group_manager=name)]
        names = [u.rsplit("/", 1)[-1] for u in urls]
        wanted = f"labels.{NAME_LABEL} = {label_value(name)}" + (f" AND labels.{LAUNCH_LABEL} = {launch}" if launch else "")
        listed = {vm.name: vm for vm in clients.call("list the MIG's VMs", lambda: list(c.instances.list(request={
            "project": project, "zone": zone, "filter": wanted})))}
        missing = [n for n in names if n not in listed]
        if missing:
            raise ProvisionError(f"the MIG {name} lists {', '.join(missing)}, which Compute Engine does not have: the "
                                 "slice is not whole", reason="failed")
        vms = [listed[n] for n in names]
    else:
        vms = [clients.call("read the VM", c.instances.get, project=project, zone=zone, instance=name)]
        if not same_launch(vms[0], launch):
            raise ProvisionError(f"the VM {name} in {project}/{zone} is another launch's, not this slice's", reason="lost")
    hosts = []
    for i, vm in enumerate(vms):
        vm_name = vm.name
        nic = vm.network_interfaces[0]
        external = next((a.nat_i_p for a in nic.access_configs if a.nat_i_p), None)
        address = nic.network_i_p if internal_ip or not external else external
        port = int(vm.labels.get(SSH_PORT_LABEL, 22) or 22)
        hosts.append(HostRecord(i, address if port == 22 else f"{address}:{port}",
                                HostInfo(internal_ip=nic.network_i_p, extra={"instance": vm_name, "id": str(vm.id)})))
    return hosts


def _reach(record: SliceRecord, reg: Registry, env: dict[str, str], opts: CloudOptions,
           watched: list[ComputeNode]) -> Made:
    """SSH to every VM (each VM's own host key pinned, as it published it; sshd awaited through a
    slow first boot), number the hosts by their worker ids, and attach the slice; its node goes
    into ``watched`` once made, so a failed launch ends its watch."""
    booting = ComputeNode(record, delete, None, watch=False)

    def gone() -> str | None:
        """While sshd is awaited through a slow first boot: a VM deleted or stopped ends the wait."""
        try:
            booting.refresh()
        except ProvisionError:
            return None  # cannot ask now: keep waiting
        return booting.lost_reason()

    try:
        hostkeys.pin(record, reg, min(opts.connect_wait, hostkeys.PUBLISH_WAIT))
        transports = ssh.connect_hosts(record, reg, opts.connect_wait, gone, boot_wait=FIRST_BOOT_WAIT)
    except HostKeyError as exc:
        raise hostkeys.refused(record, exc) from None
    order = worker_order(transports)
    record.hosts = [dataclasses.replace(record.hosts[i], index=n) for n, i in enumerate(order)]
    transports = [transports[i] for i in order]
    reg.save_slice(record)
    watched.append(node(record))
    return ssh.attach(record, reg, env, coordinator_port=None if clients.endpoint() else diagnose.COORDINATOR_PORT,
                      network=opts.network, transports=transports, node=watched[0])


def worker_order(transports: list["Transport"]) -> list[int]:
    """The transports' positions sorted by the worker id each VM's metadata gives (a single VM is
    worker 0: no round trip to ask it)."""
    from tpunb.transport.bundle import worker_source

    if len(transports) == 1:
        return [0]

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
    """The slice's VMs again (agents not started), in the worker order the launch recorded (an
    adopted slice's: read from the VMs' metadata now, and recorded)."""
    from tpunb.provision.gcp.shared import connect_wait

    if record.state == "creating" or not record.hosts:
        raise ProvisionError(f"{record.name!r} has no hosts yet: its launch did not finish. %tpu_down {record.name} "
                             "deletes whatever it created", reason="creating")
    coordinator = None if clients.endpoint() else diagnose.COORDINATOR_PORT
    wait, transports = max(30.0, connect_wait(record)), None
    if record.spec.get(adoption.UNORDERED):
        transports = ssh.connect_hosts(record, reg, wait)
        order = worker_order(transports)
        record.hosts = [dataclasses.replace(record.hosts[i], index=n) for n, i in enumerate(order)]
        transports = [transports[i] for i in order]
        record.spec.pop(adoption.UNORDERED)
        reg.save_slice(record)
    watched = node(record)
    try:
        watched.check()  # a lost slice (gone, preempted, a VM recreated) is said before any SSH error
        made = ssh.attach(record, reg, env, wait=wait, coordinator_port=coordinator, network=record.spec.get("network"),
                          node=watched, transports=transports)
    except BaseException:
        watched.close()
        raise
    return dataclasses.replace(made, failed=lambda exc: watched.close())


def adopt(name: str, reg: Registry) -> SliceRecord | None:
    """Slice ``name`` when Compute Engine has it and no record here does (a Colab reset): its record
    rebuilt from the VMs, this kernel's key given to them (adopt.py)."""
    return adoption.adopt(name, reg, API, made_hosts)


def node(record: SliceRecord) -> ComputeNode:
    """The slice's cloud side, for an attached Slice: deleted in order by %tpu_down."""
    from tpunb.provision.gcp.shared import list_price

    return ComputeNode(record, delete, list_price(record))


def delete(record: SliceRecord) -> None:
    """Delete the slice's resources in order and wait until they are gone; what could not be
    deleted is one error listing the gcloud commands for it."""
    spec = record.spec
    left = teardown(spec["project"], spec["zone"], record.name, quiet=True, vms=spec.get("vms"), launch=spec.get("launch"))
    if left:
        raise ProvisionError(f"could not delete all of {record.name}{left}", reason="delete")


def machine_type(record: SliceRecord) -> str | None:
    """The machine type of the slice's VMs (``tpu7x-standard-4t``), for %tpu_status and the sidebar."""
    try:
        return apis.compute_shape(catalog.lookup(record.accelerator)).machine_type
    except TpunbError:
        return None


def slice_cloud(record: SliceRecord, surveyed: dict | None = None) -> dict:
    """The status view's cloud columns: the slice's state (``surveyed``: see slice_state), and why its
    idle watchdog cannot delete it."""
    state = slice_state(record, surveyed)
    cloud: dict = {"cloud_state": state}
    if record.spec.get("idle_delete") and record.hosts and state != "GONE":
        problem = ComputeNode(record, delete, None, watch=False).read_idle_problem()
        cloud["idle_delete_failing"] = f"idle delete failing: {problem}" if problem else None
    return cloud


def slice_state(record: SliceRecord, surveyed: dict | None = None) -> str:
    """The slice's state as Compute Engine has it: its MIG's (or instance's), GONE, or UNKNOWN with
    why Compute Engine could not be asked (no credentials, the API down: a status view never fails
    on one slice). ``surveyed``: what a survey of the slice's project found (found.Found by name and
    launch), read instead of asking again; only the resources of the slice's own launch count."""
    from google.api_core import exceptions

    from tpunb.provision.gcp.compute import found

    spec, launch = record.spec, record.spec.get("launch")
    if surveyed is not None:
        if spec.get("zone") in getattr(surveyed, "unreachable", ()):
            return shared.unknown(f"Compute Engine could not reach {spec['zone']} now")
        seen = next(iter(found.named(surveyed, record.name, launch)), None)
        if seen is None or seen.leftover:
            return "GONE"
        if seen.zone == spec.get("zone"):
            return seen.state()
    try:
        c = clients.clients()
        if int(spec.get("vms") or 1) > 1:
            group = c.migs.get(project=spec["project"], zone=spec["zone"], instance_group_manager=record.name)
            return "GONE" if not same_launch(group, launch) else "READY" if group.status.is_stable else "CHANGING"
        vm = c.instances.get(project=spec["project"], zone=spec["zone"], instance=record.name)
        return vm.status if same_launch(vm, launch) else "GONE"
    except exceptions.NotFound:
        return "GONE"
    except TpunbError as exc:  # no credentials, most often: said once, in short
        return shared.unknown(str(exc))
    except Exception as exc:
        return shared.unknown(f"{type(exc).__name__}: {exc}")


def listed() -> bool:
    """Compute Engine is asked in surveys and adoptions (its client is installed, or the sandbox's
    endpoint is set)."""
    from tpunb.provision.gcp.compute import found

    return found.surveyed()


def gone(record: SliceRecord) -> bool:
    """The slice's resources are gone, as Compute Engine answers now."""
    return slice_state(record) == "GONE"


def replace_gone(old: SliceRecord) -> None:
    """A launch takes the name of a recorded slice whose MIG is gone: what its launch left without
    one (a template, a policy) goes, only its own launch's."""
    spec = old.spec
    if spec.get("launch"):
        teardown(spec["project"], spec.get("zone"), old.name, quiet=True, vms=spec.get("vms"), launch=spec["launch"])


def recover(record: SliceRecord) -> None:
    """Delete a lost slice's resources (its MIG, template and policy, or its instance), in order."""
    delete(record)


def state(record: SliceRecord, seen: dict) -> tuple[str, dict, float | None]:
    """The slice's state, its cloud columns (read from ``seen``, the survey's nodes, when it looked
    at the slice's project) and its uptime (None: unknown)."""
    from tpunb.provision.gcp.compute import found

    cloud = {"api": API, "machine_type": machine_type(record),
             **slice_cloud(record, seen.get((record.spec.get("project"), found.PLACE)))}
    return cloud["cloud_state"], cloud, None


def surveyed(project: str | None) -> bool:
    """A status view asks Compute Engine for a configured project's instances and MIGs (found.py)."""
    from tpunb.provision.gcp.compute import found

    return bool(project) and found.surveyed()


class Seen:
    """What a status view found in a project's Compute Engine: ``nodes`` as the survey's map holds it
    (found.PLACE: every slice, read by ``state`` without a call per slice), the orphans, and why the
    project could not be listed (``unreached``, None when it was)."""

    surveyed = "Compute Engine resources"

    def __init__(self, project: str, records: list[SliceRecord]) -> None:
        from tpunb.provision.gcp.compute import found

        here = {r.name: (r.state, r.spec.get("launch")) for r in records if r.spec.get("project") == project}
        self.nodes, self.unreached, self.look = {}, None, None
        try:
            self.look = found.ComputeSurvey(project, here)
        except Exception as exc:  # a status view never fails on an API it cannot ask: it says why
            self.unreached = exc
        else:
            self.nodes[(project, found.PLACE)] = self.look.found

    def refresh(self, record: SliceRecord, node) -> None:
        """Nothing to hand on: a Compute Engine slice's node reads its state itself."""

    def orphans(self, known: set[str], backend: str) -> list:
        return self.look.orphans(known) if self.look is not None else []


def survey(project: str | None, records: list[SliceRecord], reg: Registry) -> Seen:
    """What a status view asks Compute Engine: instances and MIGs of every zone, in four calls."""
    return Seen(project, records)


def delete_orphan(project: str | None, name: str, reg: Registry) -> bool:
    """Delete whatever Compute Engine has of a slice no record holds (in order); False when nothing."""
    from tpunb.provision.gcp.compute import found

    return bool(project and found.surveyed() and found.delete_orphan(project, name))


__all__ = ["API", "Plan", "VmSpec", "adopt", "attach", "delete", "delete_orphan", "first_granted", "gone", "listed",
           "machine_type", "plan", "recover", "replace_gone", "slice_cloud", "slice_state", "state", "survey",
           "surveyed", "teardown", "uses_compute"]
