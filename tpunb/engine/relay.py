"""Push by relay: the kernel sends a value once, cut into stripes, stripe j to the root of tree j
of hosts that pass it on over the slice's own network (``tpunb.host.relay``): K SSH channels fill
at once, and each byte crosses the notebook's link once. Every host answers over its SSH channel.

When: SSH hosts (and Cloud TPU, which reaches its hosts over SSH), values of at least
``MIN_BYTES`` whose direct sends would total ``MIN_TOTAL`` or more; BENCHMARKS.md ("Moving data:
relay") has the measurements these come from. ``TPUNB_RELAY=always|never`` overrides (tests, benches).
"""
from __future__ import annotations

import os
import secrets
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Callable

from tpunb.engine.routes import Frame, Stripes
from tpunb.errors import HostDiedError, TransportError
from tpunb.host.relay import UNREACHABLE
from tpunb.host.transfer import clipped, layout

if TYPE_CHECKING:
    from tpunb.engine.connection import HostConnection
    from tpunb.engine.request import Request

#: a value smaller than this goes directly (the tree's connections and hop cost more)...
MIN_BYTES = 1 << 20
#: ... and so does one whose direct sends would total less than this (value size x hosts)
MIN_TOTAL = 8 << 20
#: children per host in the relay tree (1: a chain; hosts - 1: one relay fanning out)
FANOUT = 4
#: most stripes a value is cut into (each its own root, SSH channel and tree)...
STRIPES = 16
#: ... each of at least this many bytes (smaller values: fewer stripes, down to one root)
STRIPE_BYTES = 1 << 20
#: a link whose round trip (the hosts' answer to relay_listen) is shorter is fast: one root
#: measures better there (the value crosses it quickly; stripes only add forwarding)
FAST_LINK = 0.025
#: seconds a host waits for its parent's stream to begin (the kernel tells it to give up sooner
#: when anything fails or Ctrl-C is pressed; the root first receives the whole value)
WAIT = 600.0
#: seconds the others get to report once the push failed somewhere
AFTERMATH = 10.0



class Relay:
    """A session's relay: its hosts' listeners (opened at the first relay, kept for their agent's
    life), the round trip of its link, and whether its hosts can reach each other at all."""

    def __init__(self, hosts: list[HostConnection], request: Callable[..., Request],
                 call: Callable[..., dict[int, tuple[dict, Any]]]) -> None:
        self.hosts = hosts
        self._request = request  # Session.request
        self._call = call  # Session.call
        #: proves hosts to each other (HMAC); sent at init, over SSH only
        self.secret = secrets.token_hex(32)
        #: the hosts could not reach each other: pushes go directly from then on
        self.unreachable = False
        #: seconds the hosts took to answer relay_listen (about one round trip of the link); None: not yet
        self.round_trip: float | None = None
        #: host -> (its agent's pid, [address, port] of its relay listener)
        self.listeners: dict[int, tuple[Any, list]] = {}

    def wanted(self, size: int, indices: list[int]) -> bool:
        """Whether a push of ``size`` bytes to these hosts goes by relay."""
        how = mode()
        if how == "never" or len(indices) < 2 or self.unreachable:
            return False
        if how == "always":
            return True
        peers = all(self.hosts[i].transport.reaches_peers for i in indices)
        return peers and size >= MIN_BYTES and size * len(indices) >= MIN_TOTAL

    def listen(self, indices: list[int]) -> dict[int, list]:
        """{host: [address, port]} of each host's relay listener, opened if its agent has none yet."""
        missing = [i for i in indices if self.listeners.get(i, (None,))[0] != self.hosts[i].info.get("pid")]
        if missing:
            started = time.monotonic()
            replies = self._call(missing, {"op": "relay_listen"}, timeout=30.0)
            self.round_trip = time.monotonic() - started
            failed = {i: r.get("error") for i, (r, _) in replies.items() if r.get("status") != "ok"}
            if failed:
                raise TransportError("cannot relay: " + "; ".join(f"host {i}: {e}" for i, e in failed.items()))
            for i, (reply, _) in replies.items():
                self.listeners[i] = (self.hosts[i].info.get("pid"), [reply["address"], reply["port"]])
        return {i: self.listeners[i][1] for i in indices}

    def push(self, segments: list, indices: list[int], fanout: int | None = None) -> bool:
        """Send ``segments`` (pickled values, ``engine.transfer.pack``) once, stripe j to host
        ``indices[j]``, which relays it to the rest; one line naming the relay host when one dies
        mid-transfer. False when the hosts cannot reach each other (or listen): the caller sends
        directly, as it will from then on for this session."""
        try:
            where = self.listen(indices)
        except TransportError:
            if any(not self.hosts[i].alive for i in indices):
                raise
            self.unreachable = True
            return False
        count = stripes(sum(len(s) for s in segments), len(indices), self.round_trip or 1.0)
        forest = trees([[i, *where[i]] for i in indices], count, fanout or FANOUT)
        errors: dict[int, str] = {}
        with self._request(indices, kind="push", grace=AFTERMATH) as request:
            cancel = {"op": "relay_cancel", "rid": request.rid}
            sizes = [len(s) for s in segments]
            request.send(Frame({"op": "relay_push", "wait": WAIT, "sizes": sizes}, stop=cancel), indices[count:])
            request.send(Stripes(segments, self._plan(segments, indices, forest), cancel), indices[:count])

            def answer(index: int, reply: dict, blob: Any) -> bool:
                if reply.get("op") != "done":
                    return False
                if reply.get("status") != "ok":
                    errors[index] = reply.get("error") or "failed"
                    request.fail(index, errors[index])
                return True

            request.collect(answer)
        if request.stopped == "interrupted":
            request.raise_for_stop("a push by relay")
        died = request.died
        for index in request.unanswered:
            errors.setdefault(index, "did not answer after the push failed elsewhere")
        if not died and any(UNREACHABLE in error for error in errors.values()):
            self.unreachable = True
            return False
        if died or errors:
            raise self._failure(forest, indices[:count], died, errors)
        return True

    def _plan(self, segments: list, indices: list[int], forest: list) -> dict[int, tuple[dict, int, int]]:
        """Root j's message (its tree) and the byte span [lo, hi) of its stripe."""
        count, total = len(forest), layout([len(s) for s in segments])[1]
        plan = {}
        for j, tree in enumerate(forest):
            root, lo, hi = self.hosts[indices[j]], total * j // count, total * (j + 1) // count
            want = sum(len(piece) for _, piece in clipped(segments, lo, hi))
            plan[root.index] = ({"op": "relay_push", "tree": tree, "me": [root.index, root.transport.address],
                                 "wait": WAIT, "stripe": [lo, hi], "stripes": count, "want": want}, lo, hi)
        return plan

    def _failure(self, forest: list, roots: list[int], died: dict[int, str], errors: dict[int, str]) -> TransportError:
        """One line: the relay host that died (index and address) before anything else."""
        for index in _relays(forest, roots):
            if index in died:
                others = sorted((set(died) | set(errors)) - {index})
                return HostDiedError(f"push failed: relay host {index} ({self.hosts[index].transport.address}) died "
                                     f"mid-transfer ({died[index]})"
                                     + (f"; hosts {others} did not get the value" if others else ""))
        if died:
            index = min(died)
            return HostDiedError(f"push failed: host {index} ({self.hosts[index].transport.address}) died ({died[index]})")
        return TransportError("push failed on " + "; ".join(f"host {i}: {e}" for i, e in sorted(errors.items())))


def mode() -> str:
    value = os.environ.get("TPUNB_RELAY", "auto").strip().lower()
    return value if value in ("always", "never") else "auto"


def plan(nodes: list[list], fanout: int) -> list:
    """The root's subtree for hosts ``nodes`` ([index, address, port] each, the root first): a
    ``fanout``-ary tree in breadth-first order, each node [index, address, port, children]."""
    made = [[*node, []] for node in nodes]
    for j, node in enumerate(made[1:], start=1):
        made[(j - 1) // max(1, fanout)][3].append(node)
    return made[0][3]


def stripes(size: int, hosts: int, round_trip: float = 1.0) -> int:
    """How many stripes a value of ``size`` bytes to ``hosts`` hosts is cut into, across a link of
    this round trip (seconds)."""
    if round_trip < FAST_LINK:
        return 1
    return max(1, min(hosts, STRIPES, size // STRIPE_BYTES))


def trees(nodes: list[list], count: int, fanout: int) -> list[list]:
    """Stripe j's tree: rooted at ``nodes[j]``, the order rotated by j so inner nodes differ."""
    return [plan(nodes[j:] + nodes[:j], fanout) for j in range(count)]


def _relays(forest: list, roots: list[int]) -> list[int]:
    """Hosts that pass the value on: the stripes' roots first, then inner nodes."""
    out, todo = dict.fromkeys(roots), deque(node for tree in forest for node in tree)
    while todo:
        index, _, _, children = todo.popleft()
        if children:
            out.setdefault(index)
        todo.extend(children)
    return list(out)
