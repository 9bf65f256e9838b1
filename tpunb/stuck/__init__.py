"""When a run hangs: where every host is (``stacks``), and the way back (``restart``).

``slice_stacks`` reads an attached slice's hosts (the kernel that owns it, even while a cell
runs); ``tpunb.server.outside.recorded_stacks`` reads them from what the registry says (any
other process: a terminal's ``python -m tpunb stacks NAME``, the sidebar's server). Both return
a ``Stacks``.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

from tpunb.stuck.read import Target, read_hosts
from tpunb.stuck.stacks import HostStacks, Stacks, from_reply

if TYPE_CHECKING:
    from tpunb.engine.cell import HeldSlice

__all__ = ["HostStacks", "Stacks", "show_stuck", "slice_stacks", "with_where"]


#: how long the stacks of hosts that would not stop may take, before they are killed anyway
STUCK_BOUND = 1.0


def with_where(results: dict, where: dict[int, str]) -> dict:
    """A cell's per-host results, each stuck host's ``where`` filled (its error line names it)."""
    for host, place in where.items():
        if host in results:
            results[host].where = place
    return results


def slice_stacks(sl: "HeldSlice", hosts: str | list[int] | None = None, native: bool = False,
                 bound: float | None = None) -> Stacks:
    """Every chosen host's stacks, all threads, read while whatever runs there keeps running;
    ``bound``: seconds after which hosts that have not answered are said to be silent."""
    indices = sl.layout.parse(hosts)
    targets = []
    for i in indices:
        host = sl.session.hosts[i]
        reason = "" if host.alive else f"its agent is not running ({host.died_reason or 'not started'})"
        targets.append(Target(i, sl.session.transports[i], host.info.get("pid"), host.info.get("stacks"), reason))
    mains = {i: (sl.session.hosts[i].info.get("stacks") or {}).get("main") for i in indices}
    found = collect(sl.name, targets, mains, native, sl.layout.names, bound)
    sl.standbys.prepare()  # someone looks for a hang: a restart may follow
    return found


def show_stuck(sl: "HeldSlice", hosts: list[int], sink, where: dict[int, str]) -> None:
    """A cell's ``on_stuck``: hosts that did not stop when interrupted, before they are killed:
    where each one is, in the cell's output and in ``where`` (for ``with_where``)."""
    names = sl.layout.names(hosts)
    many = len(hosts) > 1
    try:
        stacks = slice_stacks(sl, hosts, bound=STUCK_BOUND)  # a frozen connection must not hold the escalation
    except Exception as exc:  # never in the way of ending them
        sink.note(f"[tpunb] where host{'s' if many else ''} {names} {'are' if many else 'is'} could not be read: "
                  f"{type(exc).__name__}: {exc}")
        return
    for host in hosts:
        if host in stacks:
            where[host] = stacks[host].short
    sink.note(f"[tpunb] host{'s' if many else ''} {names} did not stop within {sl.session.interrupt_grace:g} s of the "
              f"interrupt; where {'they are' if many else 'it is'} before {'they are' if many else 'it is'} killed "
              f"(read in {stacks.seconds * 1000:.0f} ms):\n" + stacks.text(header=False))


def collect(name: str, targets: list[Target], mains: dict, native: bool, names, bound: float | None = None) -> Stacks:
    started = time.perf_counter()
    replies = read_hosts(targets, native, bound)
    hosts = {i: from_reply(i, reply, mains.get(i)) for i, reply in replies.items()}
    return Stacks(name, hosts, time.perf_counter() - started, names)
