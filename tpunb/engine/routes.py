"""How a request reaches its hosts: the routes ``Request.send`` takes.

- ``Frame``: one message (and a small blob) encoded once per kind of host, written to each;
- ``Parts``: a value as part frames of at most 2 MB from a sending thread per host, written from
  views (no copies), then the message; heartbeats and interrupts pass between the parts;
- ``Memfd``: a value written once into a memfd that hosts on this machine map copy-on-write;
- ``Stripes``: stripe j of a value as parts to the root of relay tree j (``tpunb.engine.relay``).

Each route also knows how to stop what it started (an interrupt frame, or ``relay_cancel``; on
Ctrl-C senders stop after their current part) and which hosts will then never answer.
"""
from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING

from tpunb.engine.wire import Broadcast
from tpunb.engine.request import Request, Route
from tpunb.engine import transfer as values
from tpunb.errors import TransportError
from tpunb.host import protocol, transfer

if TYPE_CHECKING:
    from tpunb.engine.connection import HostConnection

#: what stops a request on a host unless its route says otherwise
INTERRUPT = {"op": "interrupt"}


def tell(request: Request, hosts: list[HostConnection], message: dict) -> None:
    """One small frame to each host, encoded once per kind; hosts gone since are skipped (their
    death reaches the request by itself)."""
    frames = Broadcast({**message, "id": request.rid} if "id" not in message else message)
    for host in hosts:
        try:
            host.send_frame(frames.for_host(host))
        except TransportError:
            pass


def hand_on(request: Request, indices: list[int], message: dict, blob=b"") -> int:
    """A frame for hosts the request already reached, which owe no new answer for it (a chunk
    passed on, an acknowledgement, a token): its head encoded for each, its blob written from a
    view (no copy). A host that cannot take it is lost to the request. The bytes of blob written."""
    sent = 0
    for index in indices:
        host = request.connection(index)
        if _send(request, host, {**message, "id": request.rid}, blob):
            sent += len(blob)
    return sent


class Frame(Route):
    """One message for every host, encoded once per kind of host (``engine.frames.Broadcast``)."""

    def __init__(self, message: dict, blob: bytes = b"", stop: dict | None = None) -> None:
        self.message, self.blob = message, blob
        self.stop_message = stop or INTERRUPT
        self.sent: set[int] = set()

    def send(self, request: Request, hosts: list[HostConnection]) -> None:
        frames = Broadcast({**self.message, "id": request.rid}, self.blob)
        lost = []
        for host in hosts:
            try:
                host.send_frame(frames.for_host(host))
            except TransportError as exc:
                request.lost(host.index, str(exc))
                lost.append(host.index)
        self.sent.update(h.index for h in hosts)
        self.sent.difference_update(lost)

    def stop(self, request: Request, hosts: list[HostConnection], reason: str) -> set[int]:
        tell(request, [h for h in hosts if h.index in self.sent], self.stop_message)
        return set()


class Parts(Route):
    """A value (pickle 5 segments) to each host as part frames, on a thread per host, then the
    message; the agent reads each part straight into the value's buffer."""

    def __init__(self, message: dict, segments: list[memoryview], stop: dict | None = None) -> None:
        self.message, self.segments = message, segments
        self.sizes = [len(s) for s in segments]
        self.stop_message = stop or INTERRUPT
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._state: dict[int, str] = {}  # host -> "sending" | "sent" (its message too) | "dropped"

    def work(self, request: Request, host: HostConnection) -> tuple[dict, tuple[int, int] | None]:
        """What this host is sent: its message, and the byte span of the value (None: all of it)."""
        return {**self.message, "id": request.rid, "sizes": self.sizes}, None

    def expected(self, hosts: list[HostConnection]) -> int:
        return sum(self.sizes) * len(hosts)

    def send(self, request: Request, hosts: list[HostConnection]) -> None:
        request.meter.expect(self.expected(hosts), sum(self.sizes))
        for host in hosts:
            message, span = self.work(request, host)
            with self._lock:
                self._state[host.index] = "sending"
            threading.Thread(target=self._stream, args=(request, host, message, span), daemon=True,
                             name=f"tpunb-push-{host.index}").start()

    def _stream(self, request: Request, host: HostConnection, message: dict, span) -> None:
        """One host's parts (of bytes [lo, hi) given a ``span``), then its message; once stopped,
        an interrupt that makes it drop the parts instead."""
        try:
            first = True
            for at, piece in (transfer.clipped(self.segments, *span) if span else transfer.pieces(self.segments)):
                if self._stopped.is_set():
                    break
                head = {"op": "part", "id": request.rid, "at": at, **({"sizes": self.sizes} if first else {})}
                first = False
                if not _send(request, host, head, piece):
                    return
                request.meter.add(len(piece))
            with self._lock:
                dropped = self._stopped.is_set()
                self._state[host.index] = "dropped" if dropped else "sent"
            _send(request, host, {"op": "interrupt", "id": request.rid} if dropped else message)
        finally:
            with self._lock:
                if self._state.get(host.index) == "sending":  # a send failed: reported as its death
                    self._state[host.index] = "dropped"

    def stop(self, request: Request, hosts: list[HostConnection], reason: str) -> set[int]:
        """On Ctrl-C senders stop after their current part (their hosts drop what came, and never
        answer); otherwise (another host failed, a deadline) senders go on, so every host answers
        (a relay's, that it was cancelled: it is told now, before its request comes) or dies."""
        mine = [h for h in hosts if h.index in self._state]
        if reason != "interrupted":
            tell(request, mine, self.stop_message)
            return set()
        with self._lock:
            self._stopped.set()
            answering = [h for h in mine if self._state[h.index] == "sent"]
        tell(request, answering, self.stop_message)
        return {h.index for h in mine} - {h.index for h in answering}

    def close(self) -> None:
        self._stopped.set()  # senders still running stop after their current part, and say so


class Stripes(Parts):
    """A relay's roots: root j gets bytes [lo, hi) of the value as parts, then its own message
    (its tree), as a direct push sends them."""

    def __init__(self, segments: list[memoryview], plan: dict[int, tuple[dict, int, int]], stop: dict) -> None:
        super().__init__({}, segments, stop)
        self.plan = plan

    def work(self, request: Request, host: HostConnection) -> tuple[dict, tuple[int, int] | None]:
        message, lo, hi = self.plan[host.index]
        return {**message, "id": request.rid, "sizes": self.sizes}, (lo, hi)

    def expected(self, hosts: list[HostConnection]) -> int:
        return sum(self.plan[h.index][2] - self.plan[h.index][1] for h in hosts)


class Memfd(Route):
    """A value written once into a memfd that every host on this machine maps copy-on-write:
    each host's arrays are writable and its own, and nothing has a file name to leave behind."""

    def __init__(self, message: dict, segments: list[memoryview]) -> None:
        self.message, self.segments = message, segments
        self.sizes = [len(s) for s in segments]
        self.fd: int | None = None
        self.sent: set[int] = set()
        self.unsent: set[int] = set()

    def send(self, request: Request, hosts: list[HostConnection]) -> None:
        size = sum(self.sizes)
        request.meter.expect(size, size)
        if self.fd is None:
            self.fd = transfer.write_memfd(self.segments, lambda: request.presses > 0, request.meter.add)
        if self.fd is None:  # Ctrl-C while writing it: these hosts never get the request
            self.unsent.update(h.index for h in hosts)
            return
        frames = Broadcast({**self.message, "id": request.rid, "sizes": self.sizes, "shm": [values.memfd_owner(), self.fd]})
        for host in hosts:
            if _send_frame(request, host, frames.for_host(host)):
                self.sent.add(host.index)

    def stop(self, request: Request, hosts: list[HostConnection], reason: str) -> set[int]:
        tell(request, [h for h in hosts if h.index in self.sent], INTERRUPT)
        return {h.index for h in hosts} & self.unsent

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _send(request: Request, host: HostConnection, message: dict, blob=b"") -> bool:
    """Send one frame as its head and a view of its blob; a host that cannot take it is lost."""
    try:
        host.send_part(protocol.encode_head(message, len(blob), host.fast), blob)
        return True
    except TransportError as exc:
        request.lost(host.index, str(exc))
        return False


def _send_frame(request: Request, host: HostConnection, frame: bytes) -> bool:
    try:
        host.send_frame(frame)
        return True
    except TransportError as exc:
        request.lost(host.index, str(exc))
        return False
