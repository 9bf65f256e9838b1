"""The checks run on a connected slice's hosts now, for %tpu_doctor: each host answers on a side
thread of its agent, so this works while a cell runs too."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from tpunb.diagnose.reach import PROBE_SECONDS
from tpunb.errors import TransportError

if TYPE_CHECKING:
    from tpunb.display.hosts import Layout
    from tpunb.engine.session import Session


class Hosts(Protocol):
    """What the checks need of a slice (a ``tpunb.Slice`` has both): its session and host names."""

    session: Session
    layout: Layout


@dataclass
class HostCheck:
    """One host's answers: its versions, what holds its TPU and whether it reaches the
    coordinator (None: fine), each problem in one line; ``error``: the host could not answer."""

    host: int
    versions: dict | None = None
    tpu_busy: str | None = None
    coordinator: str | None = None
    error: str | None = None


def check_hosts(sl: Hosts, hosts: list[int] | None = None, probe_seconds: float = PROBE_SECONDS) -> list[HostCheck]:
    """Ask every live host (or these) for its checks; a host that cannot answer says why."""
    chosen = [h.index for h in sl.session.hosts if h.alive and (hosts is None or h.index in hosts)]
    try:
        replies = sl.session.call(chosen, {"op": "diagnose", "probe_s": probe_seconds},
                                  timeout=probe_seconds + 30) if chosen else {}
    except TransportError as exc:
        return [HostCheck(i, error=str(exc)) for i in chosen]
    checks = []
    for index in chosen:
        reply = replies[index][0]
        if reply.get("status") != "ok":
            checks.append(HostCheck(index, error=reply.get("error") or "no answer"))
        else:
            checks.append(HostCheck(index, reply.get("versions"), reply.get("tpu_busy"), reply.get("coordinator")))
    return checks


def problems(sl: Hosts, probe_seconds: float = PROBE_SECONDS) -> list[str]:
    """Every problem the checks find on the slice, one line each (empty: all is well)."""
    from tpunb.diagnose.versions import skew_line

    checks = check_hosts(sl, probe_seconds=probe_seconds)
    lines = [c.error and f"host {c.host} could not be checked: {c.error}" for c in checks]
    lines += [c.tpu_busy for c in checks] + [c.coordinator for c in checks]
    lines.append(skew_line({c.host: c.versions for c in checks}, sl.layout.names))
    return [line for line in lines if line]
