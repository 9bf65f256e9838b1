"""How a registry record becomes a Slice, per backend: local host processes, SSH hosts, Cloud TPU.

Each builder decides the transports and what every host is told when its agent starts (its
environment, how to join jax.distributed, output to drop); starting the hosts is the Slice's job.
"""
from __future__ import annotations

import os
import random
import time

from tpunb import catalog
from tpunb.errors import TransportError, UsageError
from tpunb.provision import local
from tpunb.registry import Registry, SliceRecord
from tpunb.slice import Slice


def host_env(record: SliceRecord, index: int) -> dict[str, str]:
    """What every host gets in its environment: where it sits in the slice, plus --env values."""
    env = {"TPUNB_HOST_INDEX": str(index), "TPUNB_NUM_HOSTS": str(len(record.hosts)), "TPUNB_SLICE": record.name}
    if record.accelerator:
        env["TPUNB_ACCELERATOR"] = record.accelerator
    return env


def local_slice(record: SliceRecord, reg: Registry, env: dict[str, str]) -> Slice:
    """Host processes on this machine, each seeing its share of the slice's chips as JAX CPU devices."""
    accelerator = catalog.lookup(record.accelerator)
    num_hosts = len(record.hosts)
    if record.spec.get("own_tpu"):  # %tpu_launch local: the machine's real chips (tpunb.colab)
        from tpunb import colab

        colab.check_tpu_free()
        jax_env = colab.own_tpu_environment()
    else:
        jax_env = local.host_environment(accelerator)

    def host_init(index: int, coordinator_port: int) -> dict:
        variables = {**host_env(record, index), **jax_env, **env}
        return {"env": variables, "cwd": os.getcwd(), "jax": local.jax_settings(num_hosts, index, coordinator_port),
                "drop_output": local.GLOO_CHATTER}

    return Slice(record, local.transports(record), host_init, reg)


def connect_hosts(record: SliceRecord, reg: Registry, wait: float = 0.0) -> list:
    """SSH to every host of the record; for up to ``wait`` seconds, retry while they come up
    (a new TPU VM answers READY before its sshd runs and its ssh-keys metadata is applied)."""
    from tpunb.errors import HostKeyError
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
            time.sleep(delay)  # hosts still booting: back off and try again
            delay = min(delay * 2, 10.0)


def ssh_slice(record: SliceRecord, reg: Registry, env: dict[str, str], wait: float = 0.0) -> Slice:
    """Hosts reached over SSH (brought with %tpu_connect, or a Cloud TPU node's workers):
    one connection each, jax.distributed coordinated by host 0."""
    spec = record.spec
    transports = connect_hosts(record, reg, wait)
    coordinator = record.hosts[0].info.get("internal_ip") or transports[0].host
    num_hosts = len(record.hosts)

    def host_init(index: int, coordinator_port: int) -> dict:
        variables = {**host_env(record, index), **env}
        jax = {"initialize": num_hosts > 1,
               "kwargs": {"coordinator_address": f"{coordinator}:{coordinator_port}", "num_processes": num_hosts,
                          "process_id": index, "initialization_timeout": 120}}
        return {"env": variables, "jax": jax, "drop_output": local.GLOO_CHATTER, "cwd": spec.get("cwd")}

    # a port outside Linux's ephemeral range (32768+), where outgoing connections take theirs
    return Slice(record, transports, host_init, reg, coordinator_port=lambda: random.randint(20000, 32000))


def cloud_node(record: SliceRecord, info=None, watch: bool = True):
    """The cloud side of a gcp record: its node, watched for preemption unless ``watch`` is off."""
    from tpunb.cloud import CloudNode

    spec = record.spec
    return CloudNode(record.name, record.accelerator, spec["project"], spec["zone"], bool(spec.get("spot")), info,
                     watch=watch)


def build_slice(record: SliceRecord, reg: Registry, env: dict[str, str]) -> Slice:
    """A Slice for a registry record, of whichever backend it is (hosts not started yet)."""
    if record.backend == "local":
        return local_slice(record, reg, env)
    if record.backend == "ssh":
        return ssh_slice(record, reg, env)
    if record.backend == "gcp":
        node = cloud_node(record)
        try:
            node.check()  # a preempted or deleted node: say so instead of failing to connect
            sl = ssh_slice(record, reg, env)
        except BaseException:
            node.close()
            raise
        sl.cloud = node
        return sl
    raise UsageError(f"slice {record.name!r} uses backend {record.backend!r}, which this tpunb cannot attach")
