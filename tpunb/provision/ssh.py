"""Hosts you bring (TPU VMs made elsewhere, any Linux machines), reached over SSH.

The same functions as every backend; a Cloud TPU node's workers are attached through
``attach`` too, with ``wait`` while freshly created VMs start their sshd.
"""
from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass, fields

from tpunb import diagnose, report
from tpunb.catalog import Accelerator
from tpunb.errors import AuthenticationError, HostKeyError, ProvisionError, TpunbError, TransportError, UsageError
from tpunb.transport.fanout import fan_out
from tpunb.provision import hostenv, interrupts
from tpunb.provision.base import LaunchRequest, Made, Nodes
from tpunb.provision.common import DROP_NOISE, host_env, owner_running
from tpunb.registry import HostRecord, Registry, SliceRecord
from tpunb.services.cleanup import stop_recorded
from tpunb.slice import Node
from tpunb.status import SliceStatus

NAME = "ssh"
#: how the sidebar names it, and what deleting a slice of it does ({hosts}: how many)
LABEL = "ssh (hosts you brought)"
ENDS = "its {hosts} host processes end; the hosts themselves stay yours"
CAPABILITIES: frozenset[str] = frozenset()


@dataclass(frozen=True)
class SshOptions:
    """How to reach the hosts you bring: their addresses in host order ('host' or 'host:port'),
    and the user, key, Python (one for all, or 'a,b,...' one per host) and working directory on
    them; ``coordinator_port``: a fixed port for JAX's coordinator on host 0 (one your firewall
    opens) instead of a random one per start."""

    hosts: tuple[str, ...] = ()
    user: str | None = None
    key: str | None = None
    python: str = "python3"
    cwd: str | None = None
    connect_timeout: float = 10.0
    coordinator_port: int | None = None
    setup: bool = False
    jax: str | None = None
    pip: str | None = None
    requirements: str | None = None


def options(**given) -> SshOptions:
    unknown = sorted(set(given) - {f.name for f in fields(SshOptions)})
    if unknown:
        raise UsageError(f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} for hosts you "
                         "bring: give hosts, user, key, python, cwd, connect_timeout, coordinator_port, "
                         "setup, jax, pip or requirements")
    if "hosts" in given:
        given["hosts"] = tuple(given["hosts"])
    return SshOptions(**given)


def default_name(accelerator: Accelerator | None) -> str:
    return "hosts"


def connect_hosts(record: SliceRecord, reg: Registry, wait: float = 0.0, gone=None,
                  boot_wait: float | None = None) -> list:
    """SSH to every host of the record; for up to ``wait`` seconds, retry while they come up
    (a new TPU VM answers READY before its sshd runs and its ssh-keys metadata is applied).
    ``boot_wait``: hosts that do not answer at all (a slow first boot) are waited for this long, a
    refused login only ``wait``; ``gone()``: why the hosts will never answer (a VM deleted or
    stopped), asked before each retry, so a long wait never hides a host that is gone."""
    from tpunb.transport.ssh_hosts import connect_all

    spec = record.spec
    started, delay = time.monotonic(), 1.0
    while True:
        why = gone() if gone is not None and delay > 1.0 else None
        if why:
            raise ProvisionError(f"{record.name}'s hosts will not answer: {why}", reason="lost")
        try:
            return connect_all([h.address for h in record.hosts], user=spec.get("user"), key_path=spec.get("key"),
                               python=pythons(spec.get("interpreter") or spec.get("python") or "python3",
                                              len(record.hosts)),
                               connect_timeout=spec.get("connect_timeout", 10.0), registry=reg)
        except HostKeyError:
            raise
        except TransportError as exc:
            limit = wait if isinstance(exc, AuthenticationError) or boot_wait is None else max(wait, boot_wait)
            if time.monotonic() + delay > started + limit:
                raise
            interrupts.check()
            time.sleep(delay)  # hosts still booting: back off and try again
            delay = min(delay * 2, 10.0)


def pythons(python: str, count: int) -> str | list[str]:
    """'python3' for every host, or 'a,b,...' one per host (a one-line error if the count differs)."""
    if "," not in python:
        return python
    given = [p.strip() for p in python.split(",")]
    if len(given) != count:
        raise UsageError(f"--python {python}: {len(given)} interpreters for {count} hosts; give one for all, "
                         "or one per host in host order")
    return given


def setup_spec(python: str | None, jax: str | None, pip, requirements: str | None) -> tuple[str, dict]:
    """(interpreter that starts on each host, the environment tpunb makes there) for --setup and
    cloud slices: ``python`` is X.Y (uv's managed Python; default this kernel's) or an interpreter
    on the hosts to base the environment on."""
    if python and "," in python:
        raise UsageError(f"--python {python}: one Python for every host's environment (--setup makes the same "
                         "environment on each)")
    version = not python or python == "python3" or python.replace(".", "").isdigit()
    chosen = None if not python or python == "python3" else python
    return ("python3" if version else python), hostenv.host_spec(chosen, jax, pip, requirements)


def create(request: LaunchRequest) -> Made:
    """The hosts of ``request.options`` as a new slice, connected to (their agents start next)."""
    opts: SshOptions = request.options
    if not opts or not opts.hosts:
        raise UsageError("give at least one host, e.g. %tpu_connect 10.0.0.2,10.0.0.3")
    setup = {}
    if opts.setup:
        interpreter, made = setup_spec(opts.python, opts.jax, opts.pip, opts.requirements)
        setup = {"interpreter": interpreter, "setup": made}
    elif opts.jax or opts.pip or opts.requirements:
        raise UsageError("--jax, --pip and --requirements go into the environment --setup makes: add --setup "
                         "(without it tpunb uses the hosts' Python as it is)")
    record = SliceRecord(name=request.name, accelerator=request.accelerator.name if request.accelerator else "",
                         backend=NAME, state="running", owner_pid=os.getpid(),
                         spec={**setup, "user": opts.user, "key": opts.key, "python": opts.python, "cwd": opts.cwd,
                               "connect_timeout": opts.connect_timeout, "env_keys": sorted(request.env),
                               **({"coordinator_port": opts.coordinator_port} if opts.coordinator_port else {}),
                               **({"slices": request.slices} if request.slices > 1 else {})},
                         hosts=[HostRecord(i, a) for i, a in enumerate(opts.hosts)])
    count = len(record.hosts)
    report.info(f"Connecting to {count} host{'s' if count > 1 else ''} over SSH as {record.name!r} ...")
    return attach(record, request.registry, request.env)


def attach(record: SliceRecord, reg: Registry, env: dict[str, str], wait: float = 0.0,
           node: Node | None = None, coordinator_port: int | None = None, network: str | None = None,
           metadata: bool = False, transports: list | None = None) -> Made:
    """One SSH connection per host (agents not started yet), jax.distributed coordinated by host 0,
    on ``coordinator_port`` (the record's, else a random one per start). Every host checks it can
    reach that port before JAX starts; ``network`` goes into the firewall rule named if not.

    ``metadata``: the hosts are Cloud TPU VMs, so JAX finds its process ids and coordinator in the
    VM's metadata as ``jax.distributed.initialize()`` does there (cluster "gcetpu"), and only the
    port is fixed, with JAX's own JAX_COORDINATOR_PORT; a multislice's MEGASCALE_* come from the
    VM's ``tpu-env``. Hosts with a ``setup`` spec get their environment made or checked first.
    ``transports``: connections already made to the record's hosts, in its order (else made here)."""
    spec = record.spec
    fixed = spec.get("coordinator_port") or coordinator_port
    transports = transports if transports is not None else connect_hosts(record, reg, wait)
    for transport in transports:
        transport.prepare = spec.get("setup")
    coordinator = record.hosts[0].info.internal_ip or transports[0].host
    num_hosts = len(record.hosts)

    def host_init(index: int, coordinator_port: int) -> dict:
        variables = {**host_env(record, index), **env}
        address = f"{coordinator}:{coordinator_port}"
        if metadata:
            kwargs = {"cluster_detection_method": "gcetpu", "initialization_timeout": 120}
            variables["JAX_COORDINATOR_PORT"] = str(coordinator_port)
        else:
            kwargs = {"coordinator_address": address, "num_processes": num_hosts, "process_id": index,
                      "initialization_timeout": 120}
        jax = {"initialize": num_hosts > 1, "kwargs": kwargs, "coordinator": address, "metadata": metadata,
               "probe": diagnose.probe_settings(coordinator_port, network)}
        return {"env": variables, "jax": jax, "cwd": spec.get("cwd"), **DROP_NOISE}

    # a random port outside Linux's ephemeral range (32768+), where outgoing connections take theirs
    pick = (lambda: int(fixed)) if fixed else (lambda: random.randint(20000, 32000))
    return Made(record, transports, host_init, coordinator_port=pick, node=node)


def delete(record: SliceRecord, force: bool = False) -> None:
    """The hosts are yours: nothing to delete beyond the agents, which end with their connection,
    and the services, which do not: they are stopped here."""
    if record.hosts:
        stop_recorded(record, lambda: connect_hosts(record, Registry()))


def record_transports(record: SliceRecord, reg: Registry, indices: list[int]) -> dict:
    """{host: an SSH transport to it with tpunb's key and the recorded host keys, or why none could
    be made}; hosts are reached in parallel, and one that cannot be does not stop the others."""
    from tpunb.transport.ssh_hosts import SSHTransport, parse_host

    spec = record.spec
    python = pythons(spec.get("interpreter") or spec.get("python") or "python3", len(record.hosts))

    def one(i: int) -> SSHTransport | str:
        user, host, port = parse_host(record.hosts[i].address, spec.get("user"))
        try:
            return SSHTransport(host, port, user, spec.get("key"), reg, float(spec.get("connect_timeout") or 10.0),
                                python=python if isinstance(python, str) else python[i])
        except TpunbError as exc:
            return f"unreachable ({exc})"

    return fan_out(indices, one, name="tpunb-record-ssh",
                   late=lambda made: None if isinstance(made, str) else made.close()).by_key()


def name_reusable(record: SliceRecord) -> bool:
    return False


#: hosts you bring, not connected from any kernel: one wording everywhere
NOT_CONNECTED = "not connected (%tpu_use reconnects)"


def slice_status(record: SliceRecord, nodes: Nodes) -> SliceStatus:
    """Connected while the kernel that connected them runs; their price is not ours to know."""
    connected = owner_running(record)
    return SliceStatus(state="connected" if connected else NOT_CONNECTED,
                       host_states=["connected" if connected else "not connected"] * len(record.hosts),
                       running_s=time.time() - record.created)
