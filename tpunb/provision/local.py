"""The local simulated slice: one host process per TPU host, on this machine.

Each host process sees its share of the slice's chips as JAX CPU devices, and the processes are
joined with jax.distributed over loopback, so multi-host code can be rehearsed before paying
for a pod. Host processes are children of the kernel: they end with it, and ``%tpu_use``
starts fresh ones for a slice whose kernel is gone.
"""
from __future__ import annotations

import os
import socket
import time

from tpunb import catalog, colab, report
from tpunb.catalog import Accelerator
from tpunb.errors import UsageError
from tpunb.provision.common import DROP_NOISE, host_env, owner_alive, start
from tpunb.registry import HostRecord, Registry, SliceRecord
from tpunb.units import parse_duration
from tpunb.slice import Slice
from tpunb.transport.local import LocalTransport


def default_name(accelerator: Accelerator) -> str:
    return accelerator.name


def options(**given) -> None:
    """A local slice takes no options beyond its accelerator. ``idle_delete`` is accepted and
    ignored: a simulated slice costs nothing and its host processes end with the kernel."""
    if parse_duration(given.pop("idle_delete", None), "--idle-delete", off=True):
        report.info("[tpunb] --idle-delete applies to Cloud TPU slices; a local simulated slice costs nothing and "
                    "its hosts end with this kernel, so it is ignored")
    if given:
        raise UsageError(f"unknown option{'s' if len(given) > 1 else ''} {', '.join(sorted(given))} for backend "
                         "local (cloud options need --backend gcp and a Google Cloud project)")


def create(name: str, accelerator: Accelerator, env: dict[str, str], reg: Registry, opts: None = None,
           own_tpu: bool = False, slices: int = 1) -> Slice:
    """Start one host process per TPU host of ``accelerator``; the slice is recorded once all are up.
    ``own_tpu``: one host process on this machine's real TPU chips (a Colab TPU runtime), not simulated.
    ``slices``: a multislice, every host of every slice in one jax.distributed job, slice by slice."""
    per_slice = accelerator.hosts
    hosts = [HostRecord(i, "localhost", {"devices": accelerator.devices_per_host, "slice": i // per_slice})
             for i in range(per_slice * slices)]
    spec: dict = {"own_tpu": True} if own_tpu else {}
    if slices > 1:
        spec["slices"] = slices
    record = SliceRecord(name=name, accelerator=accelerator.name, backend="local", state="running",
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
    return start(attach(record, reg, env), reg, time.perf_counter())


def attach(record: SliceRecord, reg: Registry, env: dict[str, str]) -> Slice:
    """Host processes on this machine, each seeing its share of the slice's chips as JAX CPU devices
    (not started yet). The previous ones, if any, ended with the kernel that owned them."""
    if owner_alive(record):
        raise UsageError(f"local slice {record.name!r} runs in another kernel (pid {record.owner_pid}): "
                         f"its host processes belong to that kernel; use it there or %tpu_down {record.name}")
    accelerator = catalog.lookup(record.accelerator)
    num_hosts = len(record.hosts)
    if record.spec.get("own_tpu"):  # the machine's real chips (tpunb.colab): only one process may hold them
        colab.check_tpu_free()
        jax_env = colab.own_tpu_environment()
    else:
        jax_env = host_environment(accelerator)

    def host_init(index: int, coordinator_port: int) -> dict:
        variables = {**host_env(record, index), **jax_env, **env}
        return {"env": variables, "cwd": os.getcwd(), "jax": jax_settings(num_hosts, index, coordinator_port),
                **DROP_NOISE}

    transports = [LocalTransport(f"local:{h.index}") for h in record.hosts]
    return Slice(record, transports, host_init, reg, coordinator_port=free_port)


def delete(record: SliceRecord) -> None:
    """Nothing outlives the host processes; a slice another live kernel owns is that kernel's to end."""
    if owner_alive(record):
        raise UsageError(f"local slice {record.name!r} runs in another kernel (pid {record.owner_pid}): "
                         "take it down there")


def name_reusable(record: SliceRecord) -> bool:
    """A recorded local slice whose kernel is gone holds nothing: its name may be taken again."""
    return not owner_alive(record)


def detached_state(record: SliceRecord) -> str:
    """The state %tpu_status shows for a recorded slice this kernel has not attached."""
    return "in another kernel" if owner_alive(record) else "stopped (use %tpu_use to restart)"


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
