"""Stacks of a slice this process does not own, found through the registry (a terminal's
``python -m tpunb stacks NAME``, the sidebar's server): the owning kernel publishes its hosts'
agent pids and where each dumps its stacks; local hosts are read from here, remote ones over SSH
with tpunb's key and the recorded host keys."""
from __future__ import annotations

from tpunb import provision
from tpunb.display.hosts import Layout
from tpunb.errors import NoSliceError
from tpunb.stuck import collect
from tpunb.stuck.read import Target
from tpunb.stuck.stacks import Stacks
from tpunb.provision.common import owner_running
from tpunb.registry import Registry, SliceRecord


def recorded_stacks(record: SliceRecord, registry: Registry, hosts: str | list[int] | None = None,
                    native: bool = False) -> Stacks:
    """The stacks of a slice another process owns, found through the registry: its hosts' pids and
    dump files (local hosts are read here; remote ones over SSH with tpunb's key and the recorded
    host keys)."""
    layout = Layout(len(record.hosts), record.num_slices)
    indices = layout.parse(hosts)
    if not owner_running(record):
        raise NoSliceError(f"no kernel runs {record.name!r}'s hosts now (the one that did ended): "
                           f"there is nothing to read; %tpu_use {record.name} in a notebook starts them again")
    transports = provision.record_transports(record, registry, indices)
    targets = []
    for i in indices:
        info = record.hosts[i].info
        made = transports[i]
        if isinstance(made, str):
            targets.append(Target(i, None, None, None, made, state="unreachable"))
        else:
            targets.append(Target(i, made, info.pid, info.stacks))
    try:
        return collect(record.name, targets, {i: (record.hosts[i].info.stacks or {}).get("main")
                                               for i in indices}, native, layout.names)
    finally:
        for made in transports.values():
            if not isinstance(made, str):
                made.close()
