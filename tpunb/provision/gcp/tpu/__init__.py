"""The Cloud TPU API handler: slices that are Cloud TPU nodes (or queued resources, a multislice).

``plan`` checks a launch and prepares it (zones to try, the login, the node spec) before anything
exists; the launch driver (tpunb/provision/launching.py) then runs it: ``make`` creates the node
through the failover search (one zone or many, raced with --race) and waits for READY, ``reach``
connects to every worker over SSH. The other verbs act on a recorded slice: ``attach``, ``delete``,
``state``, ``survey``, ``adopt``, ``recover``, ``delete_orphan``.

The parts: ``api`` is the one seam for every Cloud TPU call, ``node`` the cloud side of an
attached slice, ``failover`` the zones (and types) a launch tries until one grants it,
``lookups`` read-only questions, ``adoption`` nodes no registry here holds, ``records`` and ``spec``
what the API takes and returns.
"""
from __future__ import annotations

import dataclasses
import os
import time

from tpunb import catalog, diagnose, report
from tpunb.errors import AuthenticationError, HostSetupError, ProvisionError, UsageError
from tpunb.provision import ssh, warm
from tpunb.provision.base import LaunchRequest, Made
from tpunb.provision.common import owner_alive
from tpunb.provision.gcp import failures as gcp_errors
from tpunb.provision.gcp import logins, rest
from tpunb.provision.gcp.config import CloudOptions, colab_idle_default, format_duration, require_project_zone
from tpunb.provision.gcp.vm_setup import host_setup, kept
from tpunb.provision.gcp.shared import ANY, DEFAULT_TIMEOUT, Candidate, connect_wait, pause, price_per_hour
from tpunb.provision.gcp.tpu import adoption
from tpunb.provision.gcp.tpu import api, failover, lookups
from tpunb.provision.gcp.tpu.adoption import host_records
from tpunb.provision.gcp.tpu.cloud_node import CloudNode
from tpunb.registry import Registry, SliceRecord
from tpunb.units import either

API = api.API
#: a failover's record, while it launches: every zone it may have made something in
TRIED = "failover_zones"
#: in a survey's nodes, (project, UNREACHED) -> {"tpu" | "compute": why that API could not be listed}
UNREACHED = "unreachable"


def fields(opts: CloudOptions) -> dict:
    """The options as plain values (what the registry keeps and NodeSpec takes)."""
    return {f.name: getattr(opts, f.name) for f in dataclasses.fields(CloudOptions)}


class Plan:
    """A Cloud TPU launch, checked and prepared: the driver's verbs (tpunb.provision.launching.Plan)."""

    def __init__(self, request: LaunchRequest, opts: CloudOptions) -> None:
        from tpunb.transport import keys

        name, accel, env, slices = request.name, request.accelerator, request.env, request.slices
        if opts.flex or opts.reservation or opts.disk_size:
            flag = "flex" if opts.flex else "reservation" if opts.reservation else "disk-size"
            raise UsageError(f"--{flag} is for Compute Engine, which makes TPU7x, v6e and v5p: launch one of those "
                             "without --api tpu (the Cloud TPU API waits with --queued, and sizes the boot disk itself)")
        warm.ready()  # the SSH and Cloud TPU clients, imported where Ctrl-C cannot cut them
        if slices > 1 and opts.idle_delete:
            raise UsageError("--idle-delete watches one node, not yet a multislice: launch it without --idle-delete "
                             f"and end it with %tpu_down {name}")
        project, zone = require_project_zone(opts.project, opts.zone)
        self.places = places = _places(accel, project, zone, opts.alternatives)
        self.key_path, public_key = keys.default_key()
        opts = colab_idle_default(opts, slices)
        if opts.internal_ip:
            _check_reaches_vpc(opts.network)
        # before any node exists: a refusal costs nothing
        self.access = access = logins.login(project, public_key, opts.user, service_account=opts.service_account)
        opts = dataclasses.replace(opts, project=project, zone=places[0].zone, user=access.user,
                                   queued=opts.queued or opts.race is not None)
        prepared = host_setup(opts, accel)
        self.spec = api.NodeSpec(**fields(opts), name=name, accelerator=accel.name, ssh_user=access.user,
                                 ssh_public_key=public_key, slices=slices, owner=access.account or logins.owner(),
                                 os_login=access.os_login, prepared=prepared)
        self.record = SliceRecord(
            name=name, accelerator=accel.name, backend="gcp", state="creating", owner_pid=os.getpid(),
            spec={**fields(opts), **prepared, "key": str(self.key_path), "env_keys": sorted(env),
                  **({"os_login": True} if access.os_login else {}), **({"slices": slices} if slices > 1 else {}),
                  **({TRIED: sorted({p.zone for p in places})} if len(places) > 1 else {})})
        self.opts, self.registry, self.slices, self.node = opts, request.registry, slices, None
        kind = (f"multislice ({slices} nodes in one queued resource)" if slices > 1
                else "queued resource" if opts.queued else "node")
        self.price = price_per_hour(accel, opts.spot, slices)
        self.unpriced = "price unknown"
        where = either([p.zone for p in dict.fromkeys(places)]) if len(places) > 1 else places[0].zone
        self.title = (f"Launching {self.record.kind} {'spot ' if opts.spot else ''}{kind} {name!r} in "
                      f"{project}/{where} (backend gcp)")
        self.notes = []
        if (opts.queued or slices > 1) and opts.timeout is None:  # the request carries a limit either way: say which
            self.notes.append(f"[tpunb] the queued resource waits at most {format_duration(DEFAULT_TIMEOUT)} for "
                              "capacity (its valid_until_duration), then it is deleted: --timeout S changes that")
        self.search = None

    def make(self, progress) -> None:
        self.search = failover.Search(self.spec, self.places, self.opts.race or 1, progress.state,
                                      self.opts.timeout or DEFAULT_TIMEOUT)
        info, spec = self.search.run()
        record, opts = self.record, self.opts
        if len(self.places) > 1:  # the winner's place and plain options: --recover relaunches just that
            accel = catalog.lookup(spec.accelerator)
            self.opts = opts = dataclasses.replace(opts, zone=spec.zone, race=None, alternatives=None)
            record.accelerator, self.price = accel.name, price_per_hour(accel, opts.spot, self.slices)
            record.spec.update(fields(opts))
            record.spec.pop(TRIED, None)  # the losers are gone: only the winner's zone holds anything
        self.info = info
        record.hosts = host_records(info, opts.internal_ip, self.registry)
        self.search.granted = None  # made: from here the record holds the node (a failure deletes it by name)

    def undo(self, exc: BaseException) -> str:
        # the search deleted every request it made before it raised; one it granted, that ``make``
        # did not finish with (stopped while it read the hosts), goes here
        if self.search is None:
            return ""
        return self.search.undo("its launch was interrupted" if isinstance(exc, KeyboardInterrupt) else "its launch failed")

    def waiting(self, progress) -> str | None:
        if not self.opts.queued:
            return None
        states = [o.detail for o in (self.search.outcomes if self.search else []) if o.kind == "cancelled" and o.detail]
        return f"its queued resource request{f' ({states[-1]})' if states else ''}"

    def explain(self, exc: BaseException) -> None:
        pass  # the search's error names each zone's outcome already

    def reach(self, env: dict[str, str]) -> Made:
        self.node = node(self.record, self.info)
        return ssh.attach(self.record, self.registry, env, wait=self.opts.connect_wait, node=self.node,
                          **jax_coordinator(self.record))

    def close(self) -> None:
        if self.node is not None:
            self.node.close()  # its watch, also when no Slice was made of it

    def delete(self) -> str:
        record = self.record
        deleted = api.delete_or_say(record.spec["project"], record.spec["zone"], record.name,
                                    "its launch could not connect to its hosts", self.opts.queued or self.slices > 1)
        return "" if deleted is not None else " only in part (what is left is said above)"

    def refused(self, exc: BaseException) -> BaseException | None:
        if isinstance(exc, AuthenticationError) and not self.access.os_login:  # metadata key refused: OS Login?
            return AuthenticationError(gcp_errors.os_login_message(self.record.name, self.opts.project,
                                                                   self.opts.user, str(self.key_path)))
        return None

    def setup_hint(self, exc: HostSetupError) -> str:
        return ""

    def keep(self, exc: BaseException, progress) -> bool:
        return kept(self.opts, exc, self.record, self.registry, progress)

    def check(self, sl) -> None:
        if self.opts.idle_delete:  # in the start: Ctrl-C in this wait deletes the node, as it does while hosts start
            _say_idle_problem(self.opts.project, self.opts.zone, self.record.name)

    def ready(self, seconds: float) -> str:
        name, opts, hosts = self.record.name, self.opts, self.record.hosts
        cost = f"; it costs ${self.price:,.2f}/hour until %tpu_down {name}" if self.price is not None else ""
        if opts.idle_delete:
            cost += f" or {format_duration(opts.idle_delete)} without a cell (--idle-delete)"
        tries = f" ({self.search.summary()})" if len(self.places) > 1 else ""
        return (f"Slice {name!r} ready in {seconds:.1f} s{tries}: {len(hosts)} host{'s' if len(hosts) > 1 else ''}, "
                f"run cells with %%on_tpu{cost}")


def plan(request: LaunchRequest, opts: CloudOptions) -> Plan:
    """A Cloud TPU launch checked and prepared, for the launch driver."""
    return Plan(request, opts)


def _check_reaches_vpc(network: str | None) -> None:
    """The --internal-ip check, and where the hosts' packages then come from."""
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
            pause(0.1)
    except Exception:  # the slice is up: a question about its watchdog must not lose it
        return
    if problem:
        report.warn(gcp_errors.idle_problem_message(name, project, problem))


def _places(accel: catalog.Accelerator, project: str, zone: str, alternatives: str | None) -> list[Candidate]:
    """Where to try: one zone (checked against what the API lists there, else the catalog), or
    every (type, zone) of a failover."""
    zone_list = failover.zones(accel, zone)
    if len(zone_list) == 1 and not alternatives and zone.strip().lower() != ANY:
        lookups.check_offered(project, zone_list[0], accel)
        return [Candidate(accel.name, zone_list[0])]
    return failover.candidates(accel, zone_list, alternatives, any_zone=zone.strip().lower() == ANY)


def jax_coordinator(record: SliceRecord) -> dict:
    """Where JAX's coordinator listens on a node's worker 0: on Google's API port 8476, which the
    firewall rule GCP makes for TPU pods opens (a random port hangs on a custom network, see
    docs/cloud-facts.md); the sandbox's workers share one machine, so a random port each there."""
    return {"coordinator_port": None if api.endpoint() else diagnose.COORDINATOR_PORT,
            "network": record.spec.get("network"), "metadata": True}


def node(record: SliceRecord, info: api.NodeInfo | None = None, watch: bool = True) -> CloudNode:
    """The slice's cloud side (its node, watched for preemption while ``watch``)."""
    spec = record.spec
    return CloudNode(record.name, record.accelerator, spec["project"], spec["zone"], bool(spec.get("spot")), info,
                     watch=watch, idle_delete=spec.get("idle_delete") or 0, queued=bool(spec.get("queued")),
                     slices=record.num_slices)


def _queued(record: SliceRecord) -> bool:
    return bool(record.spec.get("queued")) or record.num_slices > 1


def attach(record: SliceRecord, reg: Registry, env: dict[str, str]) -> Made:
    """The node's workers over SSH (agents not started); a lost node is said before any SSH error."""
    if record.state == "creating" or not record.hosts:
        who = (f"kernel {record.owner_pid} is still launching it" if owner_alive(record)
               else "the kernel launching it stopped before it was ready")
        raise ProvisionError(f"{record.name!r} has no hosts yet: {who}. %tpu_status shows its node; "
                             f"%tpu_down {record.name} deletes whatever the launch created", reason="creating")
    watched = node(record)
    try:
        watched.check()
        made = ssh.attach(record, reg, env, wait=connect_wait(record), node=watched, **jax_coordinator(record))
    except BaseException:
        watched.close()
        raise
    return dataclasses.replace(made, failed=lambda exc: watched.close())


def delete(record: SliceRecord) -> None:
    """Delete the node and wait until it is gone. A failover whose kernel died mid-launch may have
    left requests in each zone it tried: those go too."""
    node(record, watch=False).delete()
    for zone in record.spec.get(TRIED, []):
        if zone != record.spec["zone"]:
            api.delete(record.spec["project"], zone, record.name, wait=True)


def recover(record: SliceRecord) -> None:
    """Delete a lost (preempted, terminated) node before it is launched again."""
    api.delete(record.spec["project"], record.spec["zone"], record.name, wait=True, queued=_queued(record))


def gone(record: SliceRecord) -> bool:
    """The node is gone, as the API answers now (an error: raised)."""
    spec = record.spec
    return api.get(spec["project"], spec["zone"], record.name, queued=None if _queued(record) else False) is None


def replace_gone(old: SliceRecord) -> None:
    """A launch takes the name of a recorded slice whose node is gone: nothing of it is left to delete."""


def state(record: SliceRecord, seen: dict) -> tuple[str, dict, float | None]:
    """The node's state as the survey saw it (``seen``: the survey's nodes), its cloud columns,
    and its uptime (None: unknown)."""
    place = (record.spec.get("project"), record.spec.get("zone"))
    unreached = seen.get((place[0], UNREACHED), {})
    if "tpu" in unreached:  # the API could not be asked
        state = f"UNKNOWN ({unreached['tpu']})"
        return state, {"api": API, "cloud_state": state}, None
    if place not in seen:
        return record.state, {}, None
    cloud = {"api": API, **node(record, seen[place].get(record.name), watch=False).status()}
    return cloud["cloud_state"] or "UNKNOWN", cloud, cloud["uptime_s"]


def listed() -> bool:
    """The Cloud TPU API is asked in every survey and adoption of a configured project."""
    return True


def adopt(name: str, reg: Registry) -> SliceRecord | None:
    """A node of this project no record here holds (a Colab reset): its record rebuilt and saved."""
    return adoption.adopt(name, reg)


def surveyed(project: str | None) -> bool:
    """A status view asks the Cloud TPU API always: for the configured project's nodes, and for
    those of each other project and zone a record or a failed launch names."""
    return True


def survey(project: str | None, records: list[SliceRecord], reg: Registry):
    """What a status view asks the Cloud TPU API (tpu/listing.py): the nodes found, their orphans."""
    from tpunb.provision.gcp.tpu.listing import Seen

    return Seen(project, records, reg)


def delete_orphan(project: str | None, name: str, reg: Registry) -> bool:
    """Delete a node of that name no record holds; False when there is none."""
    from tpunb.provision.gcp.tpu import listing

    return listing.delete_orphan(project, name, reg)


__all__ = ["API", "Plan", "adopt", "attach", "delete", "delete_orphan", "gone", "listed", "node", "plan", "recover",
           "replace_gone", "state", "survey", "surveyed"]
