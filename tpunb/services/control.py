"""One request to the service control process on each host (``tpunb/host/standalone/service.py``).

Services are not cells: they are reached with a short-lived process of their own on each host
(the engine's program route, ``tpunb.engine.programs``), never through the agent, so they work
the same whether the agent lives, died or belongs to a kernel that is gone.
"""
from __future__ import annotations

from pathlib import Path

from tpunb.engine import programs
from tpunb.transport.fanout import FanOutTimeout
from tpunb.transport.bundle import SERVICE_CONTROL, service_parts, service_source
from tpunb.errors import TransportError
from tpunb.registry import tpunb_home
from tpunb.transport.seam import Transport

#: seconds a host's control process may take to answer (a wait adds its own timeout)
DEADLINE = 60.0


def root_for(transport: Transport) -> str:
    """Where a host keeps its services' state and logs: under $TPUNB_HOME on this machine (local
    hosts share it), under the login's ~/.tpunb on a remote host."""
    return str(tpunb_home() / "services") if transport.same_machine else "~/.tpunb/services"


def may_have_services(transport: Transport, slice_name: str, host: int) -> bool:
    """False when a host on this machine has no service folder: nothing to ask it (deleting a
    64-host local slice starts no process); a remote host may always have some."""
    return not transport.same_machine or Path(root_for(transport), slice_name, f"host-{host}").exists()


def program(transport: Transport, request: dict, source: str | None = None, what: str = "the service control process"
            ) -> programs.Program:
    """The control process on the host with one request (``source``: another standalone program
    its bootstrap runs instead, e.g. the benchmark client)."""
    message = {"source": source or service_source(), "parts": [] if source else list(service_parts()),
               "request": request if source else {"root": root_for(transport), **request}}
    return programs.Program(transport, [transport.prepared_python or transport.python, "-c", SERVICE_CONTROL],
                            message, what)


def ask_hosts(transports: list[Transport], requests: dict[int, dict], deadline: float = DEADLINE) -> dict[int, dict]:
    """A request per host ({host: request}), all at once: {host: reply}; an unreachable host's
    reply (or one that did not answer within ``deadline`` seconds) is ``{"error": ..., "unreachable": True}``."""
    asked = programs.ask_hosts({h: program(transports[h], {**r, "host": h}) for h, r in requests.items()},
                               deadline, name="tpunb-service-control")
    for error in asked.failed.values():
        if not isinstance(error, (TransportError, FanOutTimeout)):
            raise error  # ours, not the host's: never said as "unreachable"
    return {h: asked.succeeded.get(h) or {"error": str(asked.failed[h]), "unreachable": True} for h in requests}


def follow_hosts(transports: list[Transport], requests: dict[int, dict]) -> programs.Follow[int]:
    """A follow request per host, each host's control process writing the log as it grows (use it in
    a ``with`` block: leaving it ends them)."""
    return programs.follow_hosts({h: program(transports[h], {**r, "host": h}) for h, r in requests.items()},
                                 DEADLINE, name="tpunb-service-follow")
