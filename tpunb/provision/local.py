"""The local simulated slice: one host process per TPU host, on this machine.

Each host process sees its share of the slice's chips as JAX CPU devices, and the processes are
joined with jax.distributed over loopback, so multi-host code can be rehearsed before paying
for a pod. Host processes are children of the kernel: they end with it, and ``%tpu_use``
starts fresh ones for a slice whose kernel is gone.
"""
from __future__ import annotations

import os
import signal
import socket
import time
from dataclasses import dataclass

from tpunb import catalog, colab, report
from tpunb.catalog import Accelerator
from tpunb.errors import OwnedElsewhere, TpunbError, UsageError
from tpunb.machine import procs
from tpunb.provision.base import LaunchRequest, Made, Nodes
from tpunb.provision.common import DROP_NOISE, host_env, owner_alive, owner_running
from tpunb.registry import HostInfo, HostRecord, Registry, SliceRecord, tpunb_home
from tpunb.services.cleanup import stop_recorded
from tpunb.units import parse_duration
from tpunb.status import SliceStatus
from tpunb.transport.pipes import LocalTransport

NAME = "local"
#: how the sidebar names it, and what deleting a slice of it does ({hosts}: how many)
LABEL = "local (simulated)"
ENDS = "its {hosts} host processes end and their state is lost"
CAPABILITIES = frozenset({"hosts_here"})
#: a local slice's one wording for "its kernel ended": %tpu_status, widgets and the sidebar
STOPPED = "stopped: its kernel ended (%tpu_use restarts it)"
HOST_EXIT_SECONDS = 10.0  # how long a forced delete waits for a host process to end after SIGTERM, then SIGKILL


@dataclass(frozen=True)
class LocalOptions:
    """A simulated slice takes no options; ``own_tpu`` (set by %tpu_launch local, never by a user
    option) runs one host on this machine's real TPU chips (a Colab TPU runtime)."""

    own_tpu: bool = False


def default_name(accelerator: Accelerator) -> str:
    return accelerator.name


def options(**given) -> LocalOptions:
    """A local slice takes no options beyond its accelerator. ``idle_delete`` is accepted and
    ignored: a simulated slice costs nothing and its host processes end with the kernel.
    ``own_tpu`` is set by ``%tpu_launch local`` (this machine's own chips), never by a --flag."""
    own_tpu = bool(given.pop("own_tpu", False))
    if parse_duration(given.pop("idle_delete", None), "--idle-delete", off=True):
        report.info("[tpunb] --idle-delete applies to Cloud TPU slices; a local simulated slice costs nothing and "
                    "its hosts end with this kernel, so it is ignored")
    if given:
        raise UsageError(f"unknown option{'s' if len(given) > 1 else ''} {', '.join(sorted(given))} for backend "
                         "local (cloud options need --backend gcp and a Google Cloud project)")
    return LocalOptions(own_tpu=own_tpu)


def create(request: LaunchRequest) -> Made:
    """One host process per TPU host of the accelerator, to start; the slice is recorded once all are up.
    ``options.own_tpu``: one host process on this machine's real TPU chips, not simulated.
    ``slices``: a multislice, every host of every slice in one jax.distributed job, slice by slice.
    An own TPU whose type only JAX there can say has no accelerator yet (tpunb.manager names it)."""
    name, accelerator, slices = request.name, request.accelerator, request.slices
    own_tpu = bool(request.options and request.options.own_tpu)
    if accelerator is None:
        record = SliceRecord(name=name, accelerator="", backend=NAME, state="running", owner_pid=os.getpid(),
                             hosts=[HostRecord(0, "localhost", HostInfo(slice=0))], spec={"own_tpu": True})
        report.info(f"Launching {name!r} on this machine's own TPU (1 host; its type from JAX there) ...")
        return attach(record, request.registry, request.env)
    per_slice = accelerator.hosts
    hosts = [HostRecord(i, "localhost", HostInfo(devices=accelerator.devices_per_host, slice=i // per_slice))
             for i in range(per_slice * slices)]
    spec: dict = {"own_tpu": True} if own_tpu else {}
    if slices > 1:
        spec["slices"] = slices
    record = SliceRecord(name=name, accelerator=accelerator.name, backend=NAME, state="running",
                         owner_pid=os.getpid(), hosts=hosts, spec=spec)
    chips = f"{accelerator.devices_per_host} chip{'s' if accelerator.devices_per_host > 1 else ''}"
    many = f"{slices} x {accelerator.name} as a local simulated multislice" if slices > 1 else \
        f"{accelerator.name} as a local simulated slice"
    each = f"{slices} slices x " if slices > 1 else ""
    report.info(f"Launching {name!r} on this machine's own TPU ({accelerator.name}: 1 host x {chips}) ..."
                if own_tpu else
                f"Launching {many} {name!r} (no Google Cloud project configured, or --backend local): "
                f"{each}{per_slice} host{'s' if per_slice > 1 else ''} x {accelerator.devices_per_host} "
                "JAX CPU devices ...")
    return attach(record, request.registry, request.env)


def attach(record: SliceRecord, reg: Registry, env: dict[str, str]) -> Made:
    """Host processes on this machine, each seeing its share of the slice's chips as JAX CPU devices
    (not started yet). The previous ones, if any, ended with the kernel that owned them."""
    if owner_alive(record):
        raise UsageError(f"local slice {record.name!r} runs in another kernel (pid {record.owner_pid}): "
                         f"its host processes belong to that kernel; use it there or %tpu_down {record.name}")
    accelerator = catalog.lookup(record.accelerator) if record.accelerator else None
    num_hosts = len(record.hosts)
    if record.spec.get("own_tpu"):  # the machine's real chips (tpunb.colab): only one process may hold them
        colab.check_tpu_free()
        jax_env = colab.own_tpu_environment()
    else:
        jax_env = host_environment(accelerator)

    def host_init(index: int, coordinator_port: int) -> dict:
        variables = {**host_env(record, index, str(tpunb_home())), **jax_env, **env}  # this machine is the hosts' disk
        return {"env": variables, "cwd": os.getcwd(), "jax": jax_settings(num_hosts, index, coordinator_port),
                **DROP_NOISE}

    return Made(record, local_transports(record), host_init, coordinator_port=free_port)


def delete(record: SliceRecord, force: bool = False) -> None:
    """Only services outlive the host processes: they are stopped here. A slice another live kernel
    owns is that kernel's to end, unless ``force`` (the sidebar's delete): then its host processes
    are ended from here."""
    if owner_alive(record):
        if not force:
            raise UsageError(f"local slice {record.name!r} runs in another kernel (pid {record.owner_pid}): "
                             "take it down there")
        end_hosts(record)
    stop_recorded(record, lambda: local_transports(record))


def end_hosts(record: SliceRecord) -> None:
    """End a local slice's host processes that its (live) kernel started: each is its own process
    group. Only processes the owner still started (its children, or its fork server's) are
    signalled, never a reused pid."""
    pids = [h.info.pid for h in record.hosts]
    if not all(pids):
        raise OwnedElsewhere(f"local slice {record.name!r} runs in another kernel (pid {record.owner_pid}) "
                             f"that did not publish its host processes: %tpu_down {record.name} there")
    mine = [pid for pid in pids if procs.started_by(pid, record.owner_pid)]
    for sig, wait in ((signal.SIGTERM, HOST_EXIT_SECONDS), (signal.SIGKILL, HOST_EXIT_SECONDS)):
        for pid in mine:
            try:
                os.killpg(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + wait
        while mine and time.monotonic() < deadline:
            mine = [pid for pid in mine if procs.started_by(pid, record.owner_pid)]  # a zombie has ended
            if mine:
                time.sleep(0.05)  # polling the processes' state, not a guessed delay
        if not mine:
            return
    raise TpunbError(f"host processes {mine} of {record.name!r} did not end; kill them, then %tpu_down {record.name}")


def local_transports(record: SliceRecord) -> list[LocalTransport]:
    """Its hosts are on this machine: a transport to each, for any process that asks them something
    (their services) without the kernel that owns them."""
    return [LocalTransport(f"local:{h.index}") for h in record.hosts]


def record_transports(record: SliceRecord, reg: Registry, indices: list[int]) -> dict:
    """{host: a transport to it}: its hosts are processes on this machine, which any process reaches."""
    return {i: LocalTransport(f"local:{i}") for i in indices}


def name_reusable(record: SliceRecord) -> bool:
    """A recorded local slice none of whose host processes runs holds nothing: its name may be taken again."""
    return "running" not in _host_states(record)


def slice_status(record: SliceRecord, nodes: Nodes) -> SliceStatus:
    """Running while its kernel runs (each host while its process does), free, and what it
    would cost on Cloud TPU; the host's own process is its CPU and memory (hosts share this machine)."""
    from tpunb.provision.common import list_price

    hosts = _host_states(record)
    return SliceStatus(
        state="running" if "running" in hosts else STOPPED, host_states=hosts,
        usd_per_hour=0.0, list_usd_per_hour=list_price(record), running_s=time.time() - record.created,
        cpu_metric="process_cpu_percent", memory_metric="rss_bytes")


def _host_states(record: SliceRecord) -> list[str]:
    owner = owner_running(record)
    return ["running" if owner and procs.alive(h.info.pid or record.owner_pid) else "gone" for h in record.hosts]


def free_port() -> int:
    """A loopback port for this slice's JAX coordinator."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def host_environment(accelerator: Accelerator) -> dict[str, str]:
    """What makes JAX on a CPU host look like one TPU host of the slice."""
    flags = os.environ.get("XLA_FLAGS", "")
    flags = " ".join(f for f in flags.split() if not f.startswith("--xla_force_host_platform_device_count"))
    return {
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": f"{flags} --xla_force_host_platform_device_count={accelerator.devices_per_host}".strip(),
    }


def jax_settings(num_hosts: int, index: int, coordinator_port: int) -> dict:
    """How the agent initializes jax.distributed: explicitly, over loopback."""
    return {
        "initialize": num_hosts > 1,
        "kwargs": {"coordinator_address": f"127.0.0.1:{coordinator_port}", "num_processes": num_hosts,
                   "process_id": index, "initialization_timeout": 120},
    }
