"""Push by relay: the kernel sends a value once, cut into stripes, stripe j to the root of tree j
of hosts that pass it on over the slice's own network (``tpunb.host.relay``): K SSH channels fill
at once, and each byte crosses the notebook's link once. Every host answers over its SSH channel.

When: SSH hosts (and Cloud TPU, which reaches its hosts over SSH), values of at least
``MIN_BYTES`` whose direct sends would total ``MIN_TOTAL`` or more; BENCHMARKS.md ("Moving data:
relay") has the measurements these come from. ``TPUNB_RELAY=always|never`` overrides (tests, benches).
"""
from __future__ import annotations

import os
import queue
from collections import deque
import time
import weakref
from typing import TYPE_CHECKING

from tpunb.engine.ctrl_c import CtrlC, Wake
from tpunb.engine.frames import Broadcast
from tpunb.engine.transfer import Transfer
from tpunb.errors import CellInterrupted, HostDiedError, TransportError
from tpunb.host.relay import UNREACHABLE
from tpunb.host.transfer import clipped, layout

if TYPE_CHECKING:
    from tpunb.engine.connection import HostConnection
    from tpunb.session import Session

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

#: sessions whose hosts could not reach each other: they push directly from then on
_unreachable: "weakref.WeakSet[Session]" = weakref.WeakSet()
#: session -> seconds its hosts took to answer relay_listen (about one round trip of its link)
_round_trip: "weakref.WeakKeyDictionary[Session, float]" = weakref.WeakKeyDictionary()
#: host -> (its agent's pid, [address, port] of its relay listener)
_listeners: "weakref.WeakKeyDictionary[HostConnection, tuple]" = weakref.WeakKeyDictionary()


def mode() -> str:
    value = os.environ.get("TPUNB_RELAY", "auto").strip().lower()
    return value if value in ("always", "never") else "auto"


def wanted(session: Session, size: int, indices: list[int]) -> bool:
    """Whether a push of ``size`` bytes to these hosts goes by relay."""
    how = mode()
    if how == "never" or len(indices) < 2 or session in _unreachable:
        return False
    if how == "always":
        return True
    from tpunb.transport.ssh import SSHTransport

    remote = all(isinstance(session.hosts[i].transport, SSHTransport) for i in indices)
    return remote and size >= MIN_BYTES and size * len(indices) >= MIN_TOTAL


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


def listeners(session: Session, indices: list[int]) -> dict[int, list]:
    """{host: [address, port]} of each host's relay listener, opened at the first relay and kept
    for its agent's life."""
    hosts = [session.hosts[i] for i in indices]
    missing = [h.index for h in hosts if _listeners.get(h, (None,))[0] != h.info.get("pid")]
    if missing:
        started = time.monotonic()
        replies = session.call(missing, {"op": "relay_listen"}, timeout=30.0)
        _round_trip[session] = time.monotonic() - started
        failed = {i: r.get("error") for i, (r, _) in replies.items() if r.get("status") != "ok"}
        if failed:
            raise TransportError("cannot relay: " + "; ".join(f"host {i}: {e}" for i, e in failed.items()))
        for i, (reply, _) in replies.items():
            _listeners[session.hosts[i]] = (session.hosts[i].info.get("pid"), [reply["address"], reply["port"]])
    return {h.index: _listeners[h][1] for h in hosts}


def push(session: Session, segments: list, indices: list[int], fanout: int | None = None) -> bool:
    """Send ``segments`` (pickled values, ``engine.transfer.pack``) once, stripe j to host
    ``indices[j]``, which relays it to the rest; one line naming the relay host when one dies mid-transfer. False when
    the hosts cannot reach each other (or listen): the caller sends directly, as it will from then
    on for this session."""
    try:
        where = listeners(session, indices)
    except TransportError:
        if any(not session.hosts[i].alive for i in indices):
            raise
        _unreachable.add(session)
        return False
    count = stripes(sum(len(s) for s in segments), len(indices), _round_trip.get(session, 1.0))
    forest = trees([[i, *where[i]] for i in indices], count, fanout or FANOUT)
    with CtrlC() as ctrl_c:
        request = session._request(ctrl_c)
        moving = Transfer(request.rid, request.inbox, ctrl_c, "push")  # stripes to the roots: a bar, Ctrl-C
        try:
            _send(session, request, moving, segments, indices, forest)
            died, errors = _collect(session, request, moving, indices[:count])
        finally:
            moving.close()
            session._forget(request.rid)
    if not died and any(UNREACHABLE in error for error in errors.values()):
        _unreachable.add(session)
        return False
    if died or errors:
        raise _failure(session, forest, indices[:count], died, errors)
    return True


def _send(session: Session, request, moving: Transfer, segments: list, indices: list[int], forest: list) -> None:
    """The others are asked to wait for the value from their parents; root j gets stripe j as
    parts (from a sending thread each, as a direct push sends them), then its request with its tree."""
    count, sizes = len(forest), [len(s) for s in segments]
    total = layout(sizes)[1]
    frames = Broadcast({"op": "relay_push", "id": request.rid, "wait": WAIT, "sizes": sizes})
    for i in indices[count:]:
        try:
            session.hosts[i].send_frame(frames.for_host(session.hosts[i]))
        except TransportError as exc:
            request.inbox.put((i, {"op": "died", "id": request.rid, "reason": str(exc)}, b""))
        request.pending.add(i)
    work = []
    for j, tree in enumerate(forest):
        root, lo, hi = session.hosts[indices[j]], total * j // count, total * (j + 1) // count
        request.pending.add(root.index)
        want = sum(len(piece) for _, piece in clipped(segments, lo, hi))
        work.append((root, {"op": "relay_push", "tree": tree, "me": [root.index, root.transport.address], "wait": WAIT,
                            "stripe": [lo, hi], "stripes": count, "want": want}, lo, hi))
    moving.send_stripes(work, segments)


def _collect(session: Session, request, moving: Transfer, roots: list[int]) -> tuple[dict[int, str], dict[int, str]]:
    """Every host's answer: ({host: why it died}, {host: its error}); once one fails, the rest
    are told to give up and get AFTERMATH seconds to say so."""
    inbox, ctrl_c, pending = request.inbox, request.ctrl_c, request.pending
    died: dict[int, str] = {}
    errors: dict[int, str] = {}
    deadline = None
    while pending:
        if ctrl_c.presses:
            moving.stop([session.hosts[i] for i in roots])
            _cancel(session, request)
            raise CellInterrupted(f"interrupted while hosts {sorted(pending)} were receiving a push by relay")
        if deadline is not None and time.monotonic() > deadline:
            for i in sorted(pending):
                errors[i] = "did not answer after the push failed elsewhere"
            break
        try:
            index, reply, _ = inbox.get(0.1, ctrl_c)
        except (queue.Empty, Wake):
            continue
        if index not in pending:
            continue
        host = session.hosts[index]
        if reply.get("op") == "died":
            host.notice = None  # this push reports it
            died[index] = reply.get("reason") or "its agent ended"
            if host.alive:  # a send to it failed: seen dead now, so the next request revives it
                host.give_up(died[index])
        elif reply.get("op") == "done":
            if reply.get("status") != "ok":
                errors[index] = reply.get("error") or "failed"
        else:
            continue
        pending.discard(index)
        if (died or errors) and deadline is None:
            deadline = time.monotonic() + AFTERMATH
            _cancel(session, request)
    return died, errors


def _cancel(session: Session, request) -> None:
    frames = Broadcast({"op": "relay_cancel", "rid": request.rid})
    for i in list(request.pending):
        try:
            session.hosts[i].send_frame(frames.for_host(session.hosts[i]))
        except TransportError:
            pass


def _relays(forest: list, roots: list[int]) -> list[int]:
    """Hosts that pass the value on: the stripes' roots first, then inner nodes."""
    out, todo = dict.fromkeys(roots), deque(node for tree in forest for node in tree)
    while todo:
        index, _, _, children = todo.popleft()
        if children:
            out.setdefault(index)
        todo.extend(children)
    return list(out)


def _failure(session: Session, forest: list, roots: list[int], died: dict[int, str],
             errors: dict[int, str]) -> TransportError:
    """One line: the relay host that died (index and address) before anything else."""
    for index in _relays(forest, roots):
        if index in died:
            others = sorted((set(died) | set(errors)) - {index})
            return HostDiedError(f"push failed: relay host {index} ({session.hosts[index].transport.address}) died "
                                 f"mid-transfer ({died[index]})"
                                 + (f"; hosts {others} did not get the value" if others else ""))
    if died:
        index = min(died)
        return HostDiedError(f"push failed: host {index} ({session.hosts[index].transport.address}) died ({died[index]})")
    return TransportError("push failed on " + "; ".join(f"host {i}: {e}" for i, e in sorted(errors.items())))
