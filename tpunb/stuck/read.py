"""Reading every host's stacks at once, without the agents' help.

Each agent dumps its threads from a signal handler (``tpunb.host.stacks``). A host on this
machine is signalled and read from here; a remote host through its transport, by a short-lived
reader program on the host (an SSH exec channel). So it works from the kernel that owns the
slice while a cell runs, and from any other process that can reach the hosts (the registry says
where they are): ``python -m tpunb stacks NAME``, the JupyterLab sidebar.
"""
from __future__ import annotations

from dataclasses import dataclass

from tpunb.engine import programs
from tpunb.transport.fanout import FanOutTimeout
from tpunb.errors import TransportError
from tpunb.host import stacks as host_stacks
from tpunb.transport.bundle import STACKS_READER, stacks_source
from tpunb.transport.seam import Transport

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
    read = programs.ask_hosts({host: _program(target, native) for host, target in readable.items()}, bound,
                              name="tpunb-stacks")
    for host in readable:
        replies[host] = read.succeeded.get(host) or _failure(read.failed[host], bound)
    return replies


def _failure(error: BaseException, bound: float) -> dict:
    """Why a host has no stacks: one host's failure is never the others'."""
    if isinstance(error, FanOutTimeout):
        return {"error": f"did not answer within {bound:g} s (its connection may be frozen)", "state": "unreachable"}
    if isinstance(error, TransportError):
        return {"error": f"unreachable ({error})", "state": "unreachable"}
    return {"error": f"{type(error).__name__}: {error}", "state": "unreachable"}  # a broken reply is this host's


def _program(target: Target, native: bool) -> programs.Program:
    """The stacks reader on the host; on this machine, the agent is signalled and read from here."""
    request = {"pid": target.pid, "signal": target.dump_at["signal"], "path": target.dump_at["path"],
               "native": native}
    transport = target.transport
    return programs.Program(transport, [transport.python, "-S", "-c", STACKS_READER],
                            {"source": stacks_source(), "request": request}, "the stacks reader",
                            here=lambda: host_stacks.read(request))
