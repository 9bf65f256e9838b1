"""One request to N hosts, and the engine's one wait loop.

``Session.request(hosts, ...)`` makes a Request. Its client sends it along routes
(``tpunb.engine.routes``: one frame for many hosts, a value's parts, a memfd, a relay tree) and
collects the replies with a handler of its own; everything else is the request's:

- the deadline (``timeout``), pushed on while a route's bytes still flow;
- hosts that die (their agent ended, their connection broke, a send to them failed, they stopped
  answering): each is reported once, and the others are stopped;
- Ctrl-C on the main thread (counted, never raised into a half-sent frame) and ``interrupt()``
  from any thread, the same way: the first press stops the request, each further one ends the
  current wait (interrupt, SIGTERM, SIGKILL, give up);
- once stopped, the grace the other hosts get to answer (``grace``), and for cells
  (``escalate``) SIGTERM then SIGKILL for hosts that did not stop, after ``on_stuck`` saw them.

A request runs where its client calls ``collect`` (``run``), or on a thread of its own
(``start``), with ``done``/``wait``/``result`` and ``interrupt`` from any thread; a session knows
which requests hold which hosts (``Session.holding``)::

    with session.request([0, 1], kind="pull", timeout=60) as r:
        r.send(Frame({"op": "pull", "names": ["x"]}))
        replies = {}
        r.collect(lambda host, reply, blob: reply.get("op") == "done" and replies.setdefault(host, reply))
        r.raise_for_stop()
"""
from __future__ import annotations

import itertools
import queue
import signal
import threading
import time
import warnings
from typing import TYPE_CHECKING, Any, Callable, Iterable

from tpunb.display.sink import OutputSink
from tpunb.engine.ctrl_c import CtrlC, Inbox, Wake
from tpunb.engine.transfer import Meter
from tpunb.errors import CellInterrupted, HostDiedError, TransportError

if TYPE_CHECKING:
    from tpunb.engine.connection import HostConnection

#: a further Ctrl-C ends an escalation step once it lasted this long
PRESS_FLOOR = 1.0
#: how often a running request ticks (its sink redraws, ``on_tick`` looks), however busy the hosts
TICK = 0.1

#: ``on_reply(host, message, blob) -> bool``: True once that host answered for good
OnReply = Callable[[int, dict, Any], Any]
#: ``on_tick(request)``: every TICK seconds while the request waits
OnTick = Callable[["Request"], None]
#: ``on_stuck(request, hosts) -> seconds | None``: hosts that did not stop within the grace, before
#: SIGTERM; the seconds returned are waited (collecting) before the signals, e.g. for their stacks
OnStuck = Callable[["Request", list], "float | None"]


class Route:
    """How a request's message reaches hosts (``tpunb.engine.routes``). ``send`` may report a
    host it cannot reach as died (``Request.lost``); ``stop`` tells hosts to stop (``reason``: why
    the request stopped) and returns those that will never answer (their request was never sent)."""

    def send(self, request: Request, hosts: list[HostConnection]) -> None:
        raise NotImplementedError

    def stop(self, request: Request, hosts: list[HostConnection], reason: str) -> set[int]:
        return set()

    def close(self) -> None:
        """Free what the route holds (a memfd, sending threads); called once the request ends."""


class Requests:
    """A session's requests in flight: where each one's frames go, and which hosts each holds.

    A request that takes its hosts' main thread (``exclusive``: a cell, a push) holds them from
    the moment it is sent, or earlier, from its ``claim`` (a cell claims its hosts before it
    revives them, so no other cell starts there meanwhile); ``holding`` is the one answer to
    "are these hosts busy". Claims that wait (``--queue``) take their turns in the order they
    lined up."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self._open: dict[int, Request] = {}
        self._claims: dict[int, Request] = {}  # claimed their hosts, not sent yet: no frames for them
        self._line: list[Request] = []  # waiting for their hosts, first come first
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._since = time.monotonic()  # when a request was last added or removed

    def next_id(self) -> int:
        return next(self._ids)

    def add(self, request: Request) -> None:
        with self._lock:
            self._claims.pop(request.rid, None)
            self._open[request.rid] = request
            request.held = True
            self._since = time.monotonic()
            self._changed.notify_all()

    def remove(self, request: Request) -> None:
        with self._lock:
            self._open.pop(request.rid, None)
            self._claims.pop(request.rid, None)
            request.held = False
            self._since = time.monotonic()
            self._changed.notify_all()

    def wait_quiet(self, seconds: float, given_up: Callable[[], bool], since: float = 0.0) -> bool:
        """Until no request has run for ``seconds``, counted from ``since`` at the earliest (a
        monotonic time) (True), or ``given_up()`` (False; asked at least every half second)."""
        with self._changed:
            while not given_up():
                left = max(self._since, since) + seconds - time.monotonic()
                if not self._open and left <= 0:
                    return True
                self._changed.wait(min(0.5, left) if not self._open and left > 0 else 0.5)
        return False

    def deliver(self, rid: Any, item: tuple[int, dict, Any]) -> bool:
        """Hand a frame to its request; False if none waits for it (any more)."""
        request = self._open.get(rid)
        if request is None:
            return False
        request.inbox.put(item)
        return True

    def tell_all(self, item: tuple[int, dict, Any]) -> None:
        """A frame every request must see (a host died)."""
        with self._lock:
            running = list(self._open.values())
        for request in running:
            request.inbox.put(item)

    def running(self) -> list[Request]:
        with self._lock:
            return list(self._open.values())

    def holding(self, hosts: Iterable[int]) -> list[Request]:
        """Requests (sent or claimed) that hold the main thread of any of these hosts, oldest first."""
        with self._lock:
            return self._holding(set(hosts))

    def _holding(self, hosts: set[int], but: Request | None = None) -> list[Request]:
        held = [r for r in (*self._open.values(), *self._claims.values()) if r is not but and r.exclusive
                and r.holds(hosts)]
        return sorted(held, key=lambda r: r.rid)

    def line_up(self, request: Request) -> None:
        """Put ``request`` in line for its hosts now; its ``claim(queue=True)`` comes later."""
        with self._lock:
            if request not in self._line:
                self._line.append(request)

    def in_flight(self) -> list[Request]:
        """Every request sent, claimed or in line, as it stands. Takes no lock: a signal handler asks
        (the stop button), maybe while its own thread holds it."""
        return [*self._open.values(), *self._claims.values(), *self._line]

    def claim(self, request: Request, queue: bool = False, given_up: Callable[[], bool] | None = None) -> list[Request]:
        """Take ``request``'s hosts before it is sent: [] once taken (``holding`` counts it from then
        until it ends or is ``release``d). If other requests hold them: those requests; with
        ``queue``, only after waiting in line until they are free (asked again at least every half
        second), or until ``given_up()``."""
        hosts = set(request.hosts)
        with self._changed:
            if queue and request not in self._line:
                self._line.append(request)
            try:
                while True:
                    ahead = self._line[:self._line.index(request)] if queue else []
                    blocking = self._holding(hosts, but=request) + [r for r in ahead if hosts & set(r.hosts)]
                    if not blocking:
                        self._claims[request.rid] = request
                        request.held = True
                        return []
                    if not queue or (given_up is not None and given_up()):
                        return blocking
                    self._changed.wait(0.5)
            finally:
                if request in self._line:
                    self._line.remove(request)
                    self._changed.notify_all()  # the next in line may go


class Request:
    """One request to some hosts of a session, from its first frame to the last answer.

    Made by ``Session.request`` (or ``Session.cell``); used as a context manager on the thread
    that sends and collects, or run on a thread of its own with ``start``. After ``collect``:
    ``stopped`` says why it ended early (None: every host answered), ``died`` which hosts died and
    why, ``failed`` which answered with a failure (``fail``), ``stuck`` which did not stop within
    the grace, ``killed`` which of those were signalled, ``unanswered`` which were given up.
    """

    def __init__(self, connections: list[HostConnection], table: Requests, hosts: Iterable[int], *,
                 kind: str = "request", timeout: float | None = None, sink: OutputSink | None = None,
                 grace: float = 0.0, escalate: bool = False, term_grace: float = 2.0, exclusive: bool = True,
                 on_tick: OnTick | None = None, on_stuck: OnStuck | None = None,
                 body: Callable[[Request], Any] | None = None) -> None:
        self._connections = connections
        self._table = table
        self.rid = table.next_id()
        #: what the request is (the op of its message: "exec", "push", ...), for messages and bars
        self.kind = kind
        #: the hosts it is for
        self.hosts = list(hosts)
        #: seconds from the first wait until it stops (None: no deadline)
        self.timeout = timeout
        #: where a cell's output goes as it arrives (None: nowhere, as for short requests)
        self.sink = sink
        #: seconds the other hosts get to answer once it stopped (cells: the interrupt grace)
        self.grace = grace
        #: hosts that did not stop within the grace get SIGTERM, then SIGKILL (cells); else they are left
        self.escalate = escalate
        self.term_grace = term_grace
        #: it takes the hosts' main thread (cells, pushes, pulls), so a second one there would wait
        self.exclusive = exclusive
        self.on_tick = on_tick
        self.on_stuck = on_stuck
        self.body = body
        self.inbox = Inbox()
        self.ctrl_c: CtrlC | None = None
        #: hosts that still owe an answer
        self.pending: set[int] = set()
        #: host -> time.monotonic() when it answered for good (or died, or was given up)
        self.finished: dict[int, float] = {}
        self.started = time.monotonic()
        self.stopped: str | None = None  # "interrupted", "timeout", "died", "failed"
        #: the hosts still pending when it stopped
        self.stopped_hosts: list[int] = []
        self.died: dict[int, str] = {}
        self.failed: dict[int, str] = {}
        self.stuck: list[int] = []
        self.killed: list[int] = []
        self.unanswered: list[int] = []
        self._routes: list[Route] = []
        #: host -> the connection it was sent on and the agent that had (a restart may replace both)
        self._reached: dict[int, tuple[HostConnection, Any]] = {}
        self._meter: Meter | None = None
        self._interrupts = 0
        self._interrupt_count = itertools.count(1)  # next() is atomic: no lock a signal handler could meet
        self._on_reply: OnReply | None = None
        self._open = False
        self._thread: threading.Thread | None = None
        self._outcome: tuple[bool, Any] | None = None
        self._ended: threading.Event | None = None  # made by start(): a cell's many requests need none
        #: it holds its hosts (claimed or sent, not ended): set by its session's ``Requests``
        self.held = False
        #: what the user knows it by (a background cell's ``Run``), named when its hosts are asked for
        self.owner: Any = None

    # -- lifetime -----------------------------------------------------------------------------
    def __enter__(self) -> Request:
        self.ctrl_c = CtrlC().__enter__()  # counts Ctrl-C when on the main thread, else does nothing
        self._table.add(self)
        self._open = True
        return self

    def __exit__(self, *exc: object) -> None:
        self._open = False
        self._table.remove(self)
        for route in self._routes:
            route.close()
        if self._meter is not None:
            self._meter.close()
        if self.ctrl_c is not None:
            self.ctrl_c.__exit__(*exc)

    def release(self) -> None:
        """Let go of its hosts if it claimed them and was never run (after it ran: nothing to do)."""
        if not self._open:
            self._table.remove(self)

    def run(self) -> Any:
        """Run ``body`` here, inside the request: its value, or its exception."""
        with self:
            return self.body(self)

    def start(self) -> Request:
        """Run ``body`` on a thread of its own; ``wait``, ``done``, ``result`` and ``interrupt`` from any."""
        self._ended = ended = threading.Event()

        def go() -> None:
            try:
                self._outcome = (True, self.run())
            except BaseException as exc:  # kept for result(), raised there on the caller's thread
                self._outcome = (False, exc)
            finally:
                ended.set()

        self._thread = threading.Thread(target=go, daemon=True, name=f"tpunb-request-{self.rid}")
        self._thread.start()
        return self

    def done(self) -> bool:
        """A started request has ended (its result is ready)."""
        return self._ended is not None and self._ended.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until a started request ends; False if ``timeout`` passed first."""
        if self._ended is None:
            raise RuntimeError("wait() is for a request started with start()")
        return self._ended.wait(timeout)

    def result(self, timeout: float | None = None) -> Any:
        """What ``body`` returned, or its exception raised here; TimeoutError if not ended in time."""
        if not self.wait(timeout):
            raise TimeoutError(f"the {self.kind} request still runs on hosts {sorted(self.pending)}")
        ok, value = self._outcome
        if not ok:
            raise value
        return value

    # -- what clients call ---------------------------------------------------------------------
    @property
    def meter(self) -> Meter:
        """Bytes this request moves (routes and incoming values add to it); a bar for large values."""
        if self._meter is None:
            self._meter = Meter(self.kind)
        return self._meter

    @property
    def presses(self) -> int:
        """Ctrl-C presses during this request plus ``interrupt()`` calls."""
        return self._interrupts + (self.ctrl_c.presses if self.ctrl_c is not None else 0)

    def interrupt(self) -> None:
        """Stop the request as Ctrl-C does, from any thread (also a signal handler); each further
        call ends the current wait (interrupt, SIGTERM, SIGKILL, give up)."""
        self._interrupts = next(self._interrupt_count)
        self.inbox.ring()  # SimpleQueue.put: safe in a signal handler

    def holds(self, hosts: Iterable[int]) -> bool:
        """It still runs (or has claimed to run) on one of ``hosts``."""
        if not self.held:
            return False
        running = set(self.hosts) - set(self.finished)
        return bool(running.intersection(hosts))

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def send(self, route: Route, hosts: Iterable[int] | None = None) -> None:
        """Send the request along ``route`` to these hosts (default: all of it); they owe an answer.
        A host that is not running is reported as died, as one that dies while it runs."""
        if not self._open:
            raise RuntimeError("send a request inside `with session.request(...)`")
        chosen = self.hosts if hosts is None else list(hosts)
        self.pending.update(chosen)
        if route not in self._routes:
            self._routes.append(route)
        connections = self._connections
        reachable = [connections[i] for i in chosen if connections[i].alive]
        for host in reachable:
            self._reached.setdefault(host.index, (host, host.process))
        if len(reachable) < len(chosen):
            for i in chosen:  # died after the caller looked; its "died" may have gone to no request
                if not connections[i].alive:
                    self.lost(i, connections[i].died_reason or "its agent ended")
        if reachable:
            route.send(self, reachable)

    def connection(self, index: int) -> HostConnection:
        """The connection this request reached host ``index`` on (the session's, before it was sent)."""
        reached = self._reached.get(index)
        return reached[0] if reached is not None else self._connections[index]

    def lost(self, index: int, reason: str) -> None:
        """A host this request cannot reach (a send failed): it died for this request."""
        self.inbox.put((index, {"op": "died", "id": self.rid, "reason": reason}, b""))

    def fail(self, index: int, why: str) -> None:
        """From ``on_reply``: this host answered with a failure; the request stops the others."""
        self.failed[index] = why

    def collect(self, on_reply: OnReply | None = None) -> None:
        """Wait for every pending host's answer, handing each frame of a pending host to
        ``on_reply(host, message, blob)``, which returns True once that host answered for good.
        Stops early (``stopped``) on Ctrl-C or ``interrupt()``, the deadline, a death or a
        failure; then the rest are stopped, and given the grace (and escalation) to answer."""
        self._on_reply = on_reply
        deadline = time.monotonic() + self.timeout if self.timeout else None
        reason = self._wait(until=1, deadline=deadline, running=True)
        if reason is not None:
            self._stop(reason)

    def raise_for_stop(self, what: str | None = None) -> None:
        """For short requests: why it stopped, as one error (CellInterrupted, HostDiedError,
        TransportError); nothing if every host answered."""
        what = what or self.kind
        if self.stopped == "interrupted":
            raise CellInterrupted(f"interrupted while hosts {self.stopped_hosts} were answering {what}")
        if self.died:
            index = min(self.died)
            raise HostDiedError(f"host {index} died ({self.died[index]})")
        if self.stopped == "timeout":
            raise TransportError(f"hosts {self.stopped_hosts} did not answer {what} within {self.timeout:.0f} s")
        if self.stopped == "failed":
            raise TransportError(f"{what} failed on " + "; ".join(f"host {i}: {e}" for i, e in sorted(self.failed.items())))

    # -- the wait ------------------------------------------------------------------------------
    def _wait(self, until: int, deadline: float | None, running: bool) -> str | None:
        """Apply frames until no host is pending: None, or why it stopped early. ``running``: the
        request's own wait (a death or failure stops it, flowing bytes push the deadline on);
        else a grace (only presses and the deadline end it). A press that only ends a grace
        (``until`` > 1) does so after PRESS_FLOOR seconds of it, so hosts that stop when asked
        are not killed by a burst of presses."""
        clock, get, ctrl_c, pending, on_reply = time.monotonic, self.inbox.get, self.ctrl_c, self.pending, self._on_reply
        finished, sink = self.finished, self.sink
        ticked = began = now = clock()
        moved = self._meter.done if self._meter is not None else 0
        while pending:
            if self._interrupts + ctrl_c.presses >= until and (until == 1 or clock() - began >= PRESS_FLOOR):
                return "interrupted"
            if running and (self.died or self.failed):
                return "died" if self.died else "failed"
            wait = TICK if deadline is None else max(0.0, min(TICK, deadline - now))
            try:
                index, message, blob = get(wait, ctrl_c)
            except (queue.Empty, Wake):
                index = None
            now = clock()
            if index is None or now - ticked >= TICK:
                ticked = now
                self._tick()
            if deadline is not None and now >= deadline:
                flowing = self._meter.done if self._meter is not None else 0
                if running and flowing > moved:  # bytes still flow: the wait goes on
                    moved, deadline = flowing, max(deadline, now + 1.0)
                else:
                    return "timeout"
            if index is None or index not in pending:
                continue
            if message.get("op") == "died":
                self._died(index, message, blob)
            elif on_reply is not None and on_reply(index, message, blob):  # _finish, inline: once per host
                pending.discard(index)
                finished[index] = now
                if sink is not None:
                    sink.host_done(index)
        if running and (self.died or self.failed):  # the last host's answer was a failure
            return "died" if self.died else "failed"
        return None

    def _died(self, index: int, message: dict, blob: Any) -> None:
        reason = message.get("reason") or "its agent ended"
        self.died[index] = reason
        host = self.connection(index)
        host.notice = None  # this request reports it
        if host.alive:  # a send to it failed: seen dead now, so the next request restarts it
            host.give_up(reason)
        if self._on_reply is not None:
            self._on_reply(index, message, blob)
        self._finish(index)

    def _finish(self, index: int) -> None:
        if index in self.pending:
            self.pending.discard(index)
            self.finished[index] = time.monotonic()
            if self.sink is not None:
                self.sink.host_done(index)

    def _tick(self) -> None:
        if self.sink is not None:
            self.sink.tick()
        if self.on_tick is not None:
            try:
                self.on_tick(self)
            except Exception as exc:  # a hook's bug must not leave the hosts running unwatched
                warnings.warn(f"tpunb: on_tick failed and was turned off: {type(exc).__name__}: {exc}")
                self.on_tick = None

    # -- stopping ------------------------------------------------------------------------------
    def _stop(self, reason: str) -> None:
        """Tell the hosts still running to stop (each route its own way), give them the grace to
        answer, then escalate or leave those that did not."""
        self.stopped = reason
        self.stopped_hosts = sorted(self.pending)
        hosts = [self.connection(i) for i in self.stopped_hosts]
        never: set[int] = set()
        for route in self._routes:
            never |= route.stop(self, hosts, reason) & self.pending  # their request was never sent: no answer comes
        for index in never:
            self._finish(index)
        until = self.presses + 1
        if self.pending and self.grace:
            self._wait(until, time.monotonic() + self.grace, running=False)
        if self.pending and self.escalate:
            self._escalate(until + 1)
        self.unanswered = sorted(never | self.pending)
        for index in self.unanswered:
            self._finish(index)

    def _escalate(self, until: int) -> None:
        """``on_stuck``, then SIGTERM, then SIGKILL, sent to every stuck host at once (a kill over a
        frozen connection takes seconds); hosts still pending after that are given up without
        waiting on them."""
        self._ended_elsewhere()
        self.stuck = sorted(self.pending)
        if self.on_stuck is not None:
            try:
                extra = self.on_stuck(self, list(self.stuck))
            except Exception as exc:  # the escalation goes on whatever the hook did
                warnings.warn(f"tpunb: on_stuck failed: {type(exc).__name__}: {exc}")
                extra = None
            if extra and self.pending:  # a step of its own: the next press ends it, the one after SIGTERM's
                self._wait(until, time.monotonic() + float(extra), running=False)
                until += 1
        for step, sig in enumerate((signal.SIGTERM, signal.SIGKILL)):
            self._ended_elsewhere()
            if not self.pending:
                break
            for i in sorted(self.pending):
                threading.Thread(target=self.connection(i).signal, args=(sig,), daemon=True,
                                 name=f"tpunb-signal-{i}").start()
            self.killed = sorted(set(self.killed) | set(self.pending))
            self._wait(until + step, time.monotonic() + self.term_grace, running=False)
        self._ended_elsewhere()
        for i in sorted(self.pending):  # unreachable even by SIGKILL (frozen, or its connection): give it up
            self.connection(i).give_up("did not stop when interrupted and was killed")
            self._finish(i)

    def _ended_elsewhere(self) -> None:
        """Pending hosts whose agent someone else ended meanwhile (``Session.end_agents``: a restart)
        are not stuck, and get no signal (their host may run a new agent by now): they died, for the
        reason their connection gives."""
        for i in sorted(self.pending):
            connection, agent = self._reached.get(i, (None, None))
            if connection is not None and connection.process is not agent:
                why = connection.died_reason or "its agent ended"
                self._died(i, {"op": "died", "id": self.rid, "reason": why}, b"")
