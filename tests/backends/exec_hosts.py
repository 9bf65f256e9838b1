"""A backend whose hosts are reached only through an exec channel, as a GKE backend reaches pods
with ``kubectl exec -i POD --``: each "pod" is this machine entered through a command that runs the
rest of its arguments in a bare environment of its own (``env -i``, its own HOME and working
directory), its stdin and stdout the program's. Nothing of SSH, and no shortcut of hosts on this
machine (its transports say ``same_machine`` False): cells, data, sync, services, forwards, stacks
and restart all go through ``tpunb.transport.exec.ExecTransport``.

Registered the way another package's backend would be (``$TPUNB_BACKENDS`` or the ``tpunb.backends``
entry-point group): ``exec=tests.backends.exec_hosts``.
"""
from __future__ import annotations

import os
import shutil
import sys
import time
from dataclasses import dataclass, fields
from pathlib import Path

from tpunb import catalog, report
from tpunb.catalog import Accelerator
from tpunb.errors import UsageError
from tpunb.provision.base import LaunchRequest, Made, Nodes
from tpunb.provision.common import DROP_NOISE, host_env, owner_running
from tpunb.provision.local import free_port, host_environment, jax_settings
from tpunb.registry import HostRecord, Registry, SliceRecord, tpunb_home
from tpunb.services.cleanup import stop_recorded
from tpunb.status import SliceStatus
from tpunb.transport.exec import ExecTransport

NAME = "exec"
LABEL = "exec (pods entered through a command)"
ENDS = "its {hosts} host processes end; the pods stay"
CAPABILITIES: frozenset[str] = frozenset()
#: what a pod's environment holds besides its HOME: a PATH to find sh and Python (a container's image)
KEPT = ("PATH", "LANG")


@dataclass(frozen=True)
class ExecOptions:
    """Where the pods' home directories are made (default: under $TPUNB_HOME)."""

    pods: str | None = None


def options(**given) -> ExecOptions:
    unknown = sorted(set(given) - {f.name for f in fields(ExecOptions)})
    if unknown:
        raise UsageError(f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} for backend exec: "
                         "give pods")
    return ExecOptions(**given)


def default_name(accelerator: Accelerator | None) -> str:
    return f"exec-{accelerator.name}" if accelerator else "exec"


def pod_home(record: SliceRecord, index: int) -> Path:
    return Path(record.spec["pods"]) / record.name / record.hosts[index].address


def peer_address(index: int) -> str:
    """Each pod's own address on the loopback network (127/8 is all this machine's)."""
    return f"127.0.0.{10 + index}"


def enter(record: SliceRecord, index: int) -> list[str]:
    """The exec command of one pod: what ``kubectl exec -i POD --`` is to GKE."""
    home = pod_home(record, index)
    kept = [f"{name}={os.environ[name]}" for name in KEPT if name in os.environ]
    # setsid: the pod's programs are no process of this machine's exec command (its pid and group are not
    # theirs: ending it ends nothing there), as a pod's are not kubectl's; signals go through ``kill`` run
    # there. A shell waits on the program and says how it ended as kubectl does (a signal: 128 + its number).
    return ["setsid", "-w", "env", "-i", f"HOME={home}", *kept, "sh", "-c", 'cd "$HOME" && "$@"',
            record.hosts[index].address]


def _transports(record: SliceRecord, indices: list[int]) -> dict[int, ExecTransport]:
    return {i: ExecTransport(enter(record, i), record.hosts[i].address, python=record.spec["python"],
                             reaches_peers=True) for i in indices}


def create(request: LaunchRequest) -> Made:
    """A pod per host of the accelerator (a home directory each), entered through its exec command."""
    accelerator = request.accelerator
    if accelerator is None:
        raise UsageError("the exec backend needs an accelerator, e.g. v4-16")
    pods = (request.options.pods if request.options else None) or str(tpunb_home() / "pods")
    record = SliceRecord(name=request.name, accelerator=accelerator.name, backend=NAME, state="running",
                         owner_pid=os.getpid(), spec={"pods": pods, "python": sys.executable},
                         hosts=[HostRecord(i, f"pod-{i}") for i in range(accelerator.hosts)])
    for i in range(len(record.hosts)):
        pod_home(record, i).mkdir(parents=True, exist_ok=True)
    report.info(f"Entering {len(record.hosts)} pods as {record.name!r} through an exec channel ...")
    return attach(record, request.registry, request.env)


def attach(record: SliceRecord, reg: Registry, env: dict[str, str]) -> Made:
    """An exec transport per pod (agents not started); JAX coordinated over loopback, as pods of one
    node pool reach each other; each pod says its own peer address for the relay."""
    jax_env = host_environment(catalog.lookup(record.accelerator))

    def host_init(index: int, coordinator_port: int) -> dict:
        variables = {**host_env(record, index), **jax_env, "TPUNB_PEER_ADDRESS": peer_address(index), **env}
        return {"env": variables, "cwd": str(pod_home(record, index)),
                "jax": jax_settings(len(record.hosts), index, coordinator_port), **DROP_NOISE}

    made = _transports(record, list(range(len(record.hosts))))
    return Made(record, [made[i] for i in sorted(made)], host_init, coordinator_port=free_port)


def delete(record: SliceRecord, force: bool = False) -> None:
    """Services outlive the agents: stopped here; the pods' homes go."""
    stop_recorded(record, lambda: list(_transports(record, list(range(len(record.hosts)))).values()))
    shutil.rmtree(Path(record.spec["pods"]) / record.name, ignore_errors=True)


def record_transports(record: SliceRecord, reg: Registry, indices: list[int]) -> dict:
    return _transports(record, indices)


def name_reusable(record: SliceRecord) -> bool:
    return False


def slice_status(record: SliceRecord, nodes: Nodes) -> SliceStatus:
    running = owner_running(record)
    return SliceStatus(state="running" if running else "stopped", host_states=["running" if running else "idle"]
                       * len(record.hosts), running_s=time.time() - record.created)
