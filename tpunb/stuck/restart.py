"""``%tpu_restart``: fresh Python sessions on the hosts of the same slice, the way back from a
wedged JAX runtime (JAX refuses a second ``jax.distributed.initialize()`` in a process).

Only the agents end: the node, its host environment, the connections and services stay. Every
agent is told to end at once; one that has not exited after ``EXIT_GRACE`` seconds (blocked in
C, or its SIGTERM caught by libtpu) is killed. New agents start together, and when JAX had
been started JAX starts again on every host in the background, over the whole slice, with a
fresh coordinator port. A host that cannot be reached is named and left marked as needing a
restart; the others are restarted. Where standby agents were prepared (``tpunb.engine.standby``)
they take the old agents' places at once; the next restart's are prepared once the slice is quiet.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tpunb.errors import TransportError
from tpunb.transport.fanout import fan_out
from tpunb.results import RESTARTED

if TYPE_CHECKING:
    from tpunb.engine.cell import HeldSlice

#: seconds an agent gets to exit by itself before it is killed
EXIT_GRACE = 1.0


@dataclass
class Restart:
    """What a restart did: which hosts have fresh sessions, which had to be killed, which could
    not be reached (and still need a restart), how long it took, whether JAX starts again."""

    restarted: list[int]
    killed: list[int] = field(default_factory=list)
    unreachable: dict[int, str] = field(default_factory=dict)
    seconds: float = 0.0
    jax: bool = False
    widened: bool = False  # some hosts were asked for, but JAX needs every host restarted
    #: what became of host 0's compile-cache entries (copied to the hosts that lacked them), if anything
    cache: str | None = None

    def line(self, name: str, names) -> str:
        many = len(self.restarted) > 1
        parts = [f"[tpunb] restarted host{'s' if many else ''} {names(self.restarted)} of {name!r} in "
                 f"{self.seconds:.1f} s: fresh Python session{'s' if many else ''}, "
                 f"{'their' if many else 'its'} variables are gone"]
        if self.widened:
            parts.append("every host, since JAX's distributed runtime cannot take a restarted peer back")
        if self.cache:
            parts.append(self.cache)
        if self.jax:
            parts.append("JAX is starting again over the whole slice")
        if self.killed:
            parts.append(f"host{'s' if len(self.killed) > 1 else ''} {names(self.killed)} did not exit and "
                         f"{'were' if len(self.killed) > 1 else 'was'} killed")
        if self.unreachable:
            hosts = sorted(self.unreachable)
            why = self.unreachable[hosts[0]]
            parts.append(f"host{'s' if len(hosts) > 1 else ''} {names(hosts)} could not be reached ({why}) and "
                         f"still need{'' if len(hosts) > 1 else 's'} a restart: %tpu_restart again once "
                         f"{'they answer' if len(hosts) > 1 else 'it answers'}")
        return "; ".join(parts)


def restart(sl: "HeldSlice", hosts: str | list[int] | None = None, start_jax: bool = True) -> Restart:
    """End the chosen hosts' agents (all by default) and start fresh ones; see the module docstring.
    ``start_jax=False``: JAX does not start again, so no process of tpunb's holds the chips."""
    session = sl.session
    indices = sl.layout.parse(hosts)
    jax = session.jax_started
    widened = jax and len(indices) < sl.num_hosts
    if widened:
        indices = list(range(sl.num_hosts))
    started = time.perf_counter()
    killed = session.end_agents(indices, EXIT_GRACE, RESTARTED)
    unreachable = _unreachable(session, indices)
    fresh = [i for i in indices if i not in unreachable]
    session.take_notices()  # what happened to the old agents is no news now
    if fresh:
        chosen, ready = None if len(fresh) == sl.num_hosts else fresh, sl.standbys.take(fresh)
        try:
            sl.connect(chosen, ready=ready)
        except TransportError:
            if not ready:
                raise
            sl.connect(chosen)  # a standby ended meanwhile (its connection dropped): every host cold
    cache = _share_cache(sl, fresh) if len(fresh) == sl.num_hosts > 1 else None
    if jax and start_jax and len(fresh) == sl.num_hosts:
        session.start_jax_everywhere()
    elif fresh:
        session.jax_started = False  # JAX ran on agents that are gone; none of the fresh ones runs it
    for host in sl.record.hosts:
        host.info.needs_restart = host.index in unreachable
    sl.save_hosts()
    sl.standbys.prepare_ahead(likely=True)  # the next restart's, once JAX's start and the next cell are done
    return Restart(fresh, killed, unreachable, time.perf_counter() - started, jax and start_jax and bool(fresh), widened,
                   cache)


def _share_cache(sl: "HeldSlice", hosts: list[int]) -> str | None:
    """Host 0's new compile-cache entries to the other hosts, before JAX starts again (JAX writes
    them from process 0 only): what was done, as the restart's line says it. A copy that fails
    costs those hosts a compile, never the restart."""
    from tpunb.errors import FetchFailed
    from tpunb.fetch.jaxcache import share

    try:
        done = share(sl.session, hosts, sl.layout.names)
    except (FetchFailed, TransportError) as exc:
        return f"host 0's compile-cache entries were not copied ({exc}): the other hosts compile again"
    return None if done is None or not done.entries else done.line(sl.layout.names)


def _unreachable(session, indices: list[int]) -> dict[int, str]:
    """{host: why} of chosen hosts whose connection cannot be made again (SSH hosts gone)."""
    reached = fan_out(indices, lambda i: session.transports[i].connect(), name="tpunb-reach")
    for error in reached.failed.values():
        if not isinstance(error, TransportError):
            raise error
    return {i: str(error) for i, error in reached.failed.items()}
