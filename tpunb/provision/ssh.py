"""Hosts you bring (TPU VMs made elsewhere, any Linux machines), reached over SSH.

The same functions as every backend; a Cloud TPU node's workers are attached through
``attach`` too, with ``wait`` while freshly created VMs start their sshd.
"""
from __future__ import annotations

import random
import time

from tpunb import report
from tpunb.errors import HostKeyError, TransportError
from tpunb.provision import interrupts
from tpunb.provision.common import DROP_NOISE, host_env, start
from tpunb.registry import Registry, SliceRecord
from tpunb.slice import Node, Slice


def connect_hosts(record: SliceRecord, reg: Registry, wait: float = 0.0) -> list:
    """SSH to every host of the record; for up to ``wait`` seconds, retry while they come up
    (a new TPU VM answers READY before its sshd runs and its ssh-keys metadata is applied)."""
    from tpunb.transport.ssh import connect_all

    spec = record.spec
    deadline, delay = time.monotonic() + wait, 1.0
    while True:
        try:
            return connect_all([h.address for h in record.hosts], user=spec.get("user"), key_path=spec.get("key"),
                               python=spec.get("python", "python3"),
                               connect_timeout=spec.get("connect_timeout", 10.0), registry=reg)
        except HostKeyError:
            raise
        except TransportError:
            if time.monotonic() + delay > deadline:
                raise
            interrupts.check()
            time.sleep(delay)  # hosts still booting: back off and try again
            delay = min(delay * 2, 10.0)


def create(record: SliceRecord, reg: Registry, env: dict[str, str]) -> Slice:
    """Connect to the hosts of a new record (made by %tpu_connect) and start their agents."""
    started = time.perf_counter()
    count = len(record.hosts)
    report.info(f"Connecting to {count} host{'s' if count > 1 else ''} over SSH as {record.name!r} ...")
    return start(attach(record, reg, env), reg, started)


def attach(record: SliceRecord, reg: Registry, env: dict[str, str], wait: float = 0.0,
           node: Node | None = None) -> Slice:
    """One SSH connection per host (agents not started yet), jax.distributed coordinated by host 0."""
    spec = record.spec
    transports = connect_hosts(record, reg, wait)
    coordinator = record.hosts[0].info.get("internal_ip") or transports[0].host
    num_hosts = len(record.hosts)

    def host_init(index: int, coordinator_port: int) -> dict:
        variables = {**host_env(record, index), **env}
        jax = {"initialize": num_hosts > 1,
               "kwargs": {"coordinator_address": f"{coordinator}:{coordinator_port}", "num_processes": num_hosts,
                          "process_id": index, "initialization_timeout": 120}}
        return {"env": variables, "jax": jax, "cwd": spec.get("cwd"), **DROP_NOISE}

    # a port outside Linux's ephemeral range (32768+), where outgoing connections take theirs
    return Slice(record, transports, host_init, reg, coordinator_port=lambda: random.randint(20000, 32000), node=node)


def delete(record: SliceRecord) -> None:
    """The hosts are yours: nothing to delete beyond the agents, which end with their connection."""


def name_reusable(record: SliceRecord) -> bool:
    return False


def detached_state(record: SliceRecord) -> str:
    return "not connected (use %tpu_use to reconnect)"
