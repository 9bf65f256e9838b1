"""One request to the service control process on each host (``tpunb/host/standalone/service.py``).

Services are not cells: they are reached with a short-lived process of their own on each host,
never through the agent, so they work the same whether the agent lives, died or belongs to a
kernel that is gone.
"""
from __future__ import annotations

from pathlib import Path

from tpunb.errors import TransportError
from tpunb.fanout import fan_out
from tpunb.engine.bundle import SERVICE_CONTROL, service_source
from tpunb.registry import tpunb_home
from tpunb.transport.base import Transport, ask_program


def root_for(transport: Transport) -> str:
    """Where a host keeps its services' state and logs: under $TPUNB_HOME on this machine (local
    hosts share it), under the login's ~/.tpunb on a remote host."""
    return str(tpunb_home() / "services") if transport.same_machine else "~/.tpunb/services"


def may_have_services(transport: Transport, slice_name: str, host: int) -> bool:
    """False when a host on this machine has no service folder: nothing to ask it (deleting a
    64-host local slice starts no process); a remote host may always have some."""
    return not transport.same_machine or Path(root_for(transport), slice_name, f"host-{host}").exists()


def ask(transport: Transport, request: dict) -> dict:
    """Run one request on the host and return its reply; TransportError if the host is unreachable."""
    return ask_program(transport, [transport.prepared_python or transport.python, "-c", SERVICE_CONTROL],
                       {"source": service_source(), "request": {"root": root_for(transport), **request}},
                       "the service control process")


def ask_hosts(transports: list[Transport], requests: dict[int, dict]) -> dict[int, dict]:
    """A request per host ({host: request}), all at once: {host: reply}; an unreachable host's
    reply is ``{"error": ..., "unreachable": True}``."""
    def one(host: int) -> dict:
        try:
            return ask(transports[host], {**requests[host], "host": host})
        except TransportError as exc:
            return {"error": str(exc), "unreachable": True}

    return fan_out(list(requests), one, workers=32, name="tpunb-service-control").by_key()
