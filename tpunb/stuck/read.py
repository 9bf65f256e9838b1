"""Reading every host's stacks at once, without the agents' help.

Each agent dumps its threads from a signal handler (``tpunb.host.stacks``). A host on this
machine is signalled and read from here; a remote host through its transport, by a short-lived
reader program on the host (an SSH exec channel). So it works from the kernel that owns the
slice while a cell runs, and from any other process that can reach the hosts (the registry says
where they are): ``python -m tpunb stacks NAME``, the JupyterLab sidebar.
"""
from __future__ import annotations

from dataclasses import dataclass

from tpunb.errors import TransportError
from tpunb.fanout import fan_out
from tpunb.host import stacks as host_stacks
from tpunb.engine.bundle import STACKS_READER, stacks_source
from tpunb.transport.base import Transport, ask_program

#: seconds a remote reader may take beyond the dump itself (its SSH channel, a login shell, Python)
REMOTE_SLACK = 15.0


@dataclass
class Target:
    """One host to read: how to reach it, its agent's pid and where that agent dumps (the hello's
    ``stacks``); ``reason``: why it cannot be asked at all (its agent died)."""

    host: int
    transport: Transport | None
    pid: int | None
    dump_at: dict | None
    reason: str = ""
    state: str = "gone"


def read_hosts(targets: list[Target], native: bool = False, bound: float | None = None) -> dict[int, dict]:
    """{host: the reader's reply} (``text``, ``native``) or ``{"error", "state"}``, every host at once;
    hosts that have not answered after ``bound`` seconds (default: generous) are said to be silent."""
    replies: dict[int, dict] = {}
    readable: dict[int, Target] = {}
    for target in targets:
        if target.reason or not target.pid or not target.dump_at:
            replies[target.host] = {"error": target.reason or "its agent cannot dump its stacks (an older tpunb "
                                    "started it: restart the slice)", "state": target.state}
        else:
            readable[target.host] = target
    if bound is None:
        bound = host_stacks.ANSWER + 3.0 + (host_stacks.PYSPY_TIMEOUT if native else 0.0) + REMOTE_SLACK
    read = fan_out(list(readable), lambda host: _answer(readable[host], native), deadline=bound, name="tpunb-stacks")
    for host in readable:
        replies[host] = read.succeeded.get(host) or {
            "error": f"did not answer within {bound:g} s (its connection may be frozen)", "state": "unreachable"}
    return replies


def _answer(target: Target, native: bool) -> dict:
    """The host's reply, or why there is none: one host's failure is never the others'."""
    request = {"pid": target.pid, "signal": target.dump_at["signal"], "path": target.dump_at["path"],
               "native": native}
    try:
        reply = _read(target.transport, request)
    except TransportError as exc:
        reply = {"error": f"unreachable ({exc})", "state": "unreachable"}
    except Exception as exc:  # a broken reply is this host's answer, never the others' failure
        reply = {"error": f"{type(exc).__name__}: {exc}", "state": "unreachable"}
    return reply


def _read(transport: Transport, request: dict) -> dict:
    if transport.same_machine:  # this machine: signal and read it from here
        return host_stacks.read(request)
    return ask_program(transport, [transport.python, "-S", "-c", STACKS_READER],
                       {"source": stacks_source(), "request": request}, "the stacks reader")
