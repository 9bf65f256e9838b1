"""The local simulated slice: one host process per TPU host, on this machine.

Each host process sees its share of the slice's chips as JAX CPU devices, and the processes are
joined with jax.distributed over loopback, so multi-host code can be rehearsed before paying
for a pod. Host processes are children of the kernel: they end with it, and ``%tpu_use``
starts fresh ones for a slice whose kernel is gone.
"""
from __future__ import annotations

import os
import socket

from tpunb.catalog import Accelerator
from tpunb.registry import HostRecord, SliceRecord
from tpunb.transport.local import LocalTransport


def create(name: str, accelerator: Accelerator) -> SliceRecord:
    """The record of a new local slice; its processes are started by the Slice's session."""
    hosts = [HostRecord(i, "localhost", {"devices": accelerator.devices_per_host}) for i in range(accelerator.hosts)]
    return SliceRecord(name=name, accelerator=accelerator.name, backend="local", state="running",
                       owner_pid=os.getpid(), hosts=hosts)


def transports(record: SliceRecord) -> list[LocalTransport]:
    return [LocalTransport(f"local:{h.index}") for h in record.hosts]


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


#: CPU collectives (gloo) print a line per communicator from C++ threads, unconditionally and
#: sometimes interleaved: any line with these fragments is noise on a simulated slice
GLOO_CHATTER = r"\[Gloo\]|peer ranks"


def jax_settings(num_hosts: int, index: int, coordinator_port: int) -> dict:
    """How the agent initializes jax.distributed: explicitly, over loopback."""
    return {
        "initialize": num_hosts > 1,
        "kwargs": {"coordinator_address": f"127.0.0.1:{coordinator_port}", "num_processes": num_hosts,
                   "process_id": index, "initialization_timeout": 120},
    }
