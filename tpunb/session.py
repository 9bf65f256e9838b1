"""Fan-out of one request to N agents, merge of their replies, interrupts, timeouts, deaths.

A Session owns one HostConnection per host. The agents' frames become events on the queue of
the request they belong to: local hosts' frames are all read by one thread (a selector over their
pipes, ``tpunb.transport.fanin``), hosts over SSH each have a reader thread of their own.
``execute`` runs one cell on some hosts, forwards output to a sink as it arrives, and returns
per-host results; when the kernel is interrupted, a deadline passes or a host dies, it interrupts
the rest and, if they do not stop, escalates (SIGTERM, then SIGKILL) so a cell can never hang the
notebook.

Liveness: agents send a frame at least every second (a ``beat`` when they have nothing else to
say), so a host silent for ``heartbeat_timeout`` seconds is frozen (a stopped process, a stopped
sshd session, a dead or half-open connection): a watch thread ends it and fails its cell, during
a cell or between cells, without waiting for anyone to press interrupt.
"""
from __future__ import annotations

import itertools
import os
import queue
import secrets
import signal
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from tpunb.display.sink import OutputSink
from tpunb.engine import relay
from tpunb.engine.connection import HostConnection
from tpunb.engine.ctrl_c import CtrlC, Inbox, Wake
from tpunb.engine.frames import Broadcast
from tpunb.engine.transfer import Transfer, pack, shares_memory
from tpunb.errors import CellInterrupted, HostDiedError, RemoteError, TransportError
from tpunb.host.transfer import INLINE, join
from tpunb.results import KEEP_DISPLAYS, HostResult, Tail
from tpunb.transport.base import Transport
from tpunb.transport.fanin import FanIn

#: how often the watch thread looks at every host's last frame
WATCH_PERIOD = 0.25
#: seconds of silence after which a host counts as frozen, unless $TPUNB_HEARTBEAT_TIMEOUT says (0: never)
HEARTBEAT_TIMEOUT = 5.0
#: agents beat this often (or more often, for short timeouts)
BEAT_INTERVAL = 1.0
#: a further Ctrl-C ends an escalation step once it lasted this long
PRESS_FLOOR = 1.0


def default_heartbeat_timeout() -> float:
    try:
        seconds = float(os.environ.get("TPUNB_HEARTBEAT_TIMEOUT", HEARTBEAT_TIMEOUT))
    except ValueError:
        return HEARTBEAT_TIMEOUT
    return seconds if seconds > 0 else 0.0


@dataclass(eq=False, slots=True)
class Request:
    """One request in flight: where its frames arrive, and what the session makes of them."""

    rid: int
    inbox: Inbox
    ctrl_c: CtrlC | None = None
    sink: OutputSink = field(default_factory=OutputSink)
    results: dict[int, HostResult] = field(default_factory=dict)  # a cell's, per host
    pending: set[int] = field(default_factory=set)  # hosts it still waits on


class Session:
    """Persistent agents on every host of a slice, and the requests that fan out to them."""

    #: how long interrupted hosts get to stop before SIGTERM, and SIGTERM before SIGKILL
    interrupt_grace = 3.0
    term_grace = 2.0

    def __init__(self, transports: list[Transport], init_for_host: Callable[[int], dict],
                 start_timeout: float = 120.0) -> None:
        #: seconds without a frame after which a host is taken as frozen and ended (0: never)
        self.heartbeat_timeout = default_heartbeat_timeout()
        self.closed = False
        self._start_lock = threading.Lock()  # one start (revival) at a time
        self._watch_stop = threading.Event()
        self._watching = False
        self.transports = transports
        self.init_for_host = init_for_host
        self.start_timeout = start_timeout
        #: one thread reads every host whose frames arrive on a file descriptor
        self.fanin = FanIn()
        self.hosts = [HostConnection(i, t, self._route, self.fanin) for i, t in enumerate(transports)]
        self._ids = itertools.count(1)
        self._waiters: dict[int, Inbox] = {}  # request id -> where its frames go
        self._waiters_lock = threading.Lock()
        self.backlog: queue.Queue = queue.Queue()  # frames outside any request (stray output)
        self.jax_started = False
        #: (host, error) of hosts that failed to join JAX when another host started it, not yet said
        self.jax_failures: queue.SimpleQueue[tuple[int, str]] = queue.SimpleQueue()
        self._cells = itertools.count(1)  # one number per cell, the same on every host
        self.colors: str | None = None  # the traceback colour scheme hosts use (the kernel's)
        self.on_metrics: Callable[[int, dict], None] | None = None  # (host, metrics frame)
        #: (hosts, sink, results) of a cell whose hosts did not stop when interrupted, before they
        #: are killed: the slice shows where they are (tpunb.hangs)
        self.before_escalation: Callable[[list[int], OutputSink, dict[int, HostResult]], None] | None = None
        self._relay_secret = secrets.token_hex(32)  # proves hosts to each other (relay); sent at init, over SSH only

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self, indices: Iterable[int] | None = None) -> None:
        """Start agents on these hosts (default all) in parallel; one start at a time."""
        with self._start_lock:
            self._start(indices)
        if not self._watching:
            self._watching = True
            threading.Thread(target=_watch, args=(weakref.ref(self), self._watch_stop), daemon=True,
                             name="tpunb-liveness").start()

    def _start(self, indices: Iterable[int] | None) -> None:
        if self.closed:
            raise TransportError("this slice's host sessions were closed")
        chosen = [self.hosts[i] for i in (indices if indices is not None else range(len(self.hosts)))]
        errors = []
        try:
            for host in chosen:
                host.close()
                host.launch()
        except TransportError as exc:
            errors.append(exc)
        beat = self.beat_interval()
        threads = []
        for host in chosen if not errors else ():
            def shake(h=host):
                try:
                    h.handshake({**self.init_for_host(h.index), "heartbeat": beat, "relay_secret": self._relay_secret},
                                self.start_timeout)
                except Exception as exc:  # collected and reported together below
                    errors.append(exc)
            thread = threading.Thread(target=shake, daemon=True)
            thread.start()
            threads.append(thread)
        for thread in threads:
            thread.join()
        if self.closed and not errors:  # closed (the slice deleted) while these started: end them too
            errors.append(TransportError("this slice's host sessions were closed while starting"))
        if errors:
            for host in chosen:
                host.close()
            raise errors[0] if len(errors) == 1 else TransportError("; ".join(str(e) for e in errors))

    def close(self) -> None:
        """End every host's agent, then its connection (in parallel: each may wait a moment for its
        agent to exit)."""
        self.closed = True
        self._watch_stop.set()

        def end(host: HostConnection) -> None:
            host.close()
            host.transport.close()

        threads = [threading.Thread(target=end, args=(host,), daemon=True) for host in self.hosts]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self.fanin.close()

    def end_agents(self, indices: list[int], grace: float, reason: str) -> list[int]:
        """End these hosts' agents at once (end of input; killed if not gone within ``grace``), and
        tell requests still waiting on them why; the hosts that had to be killed."""
        killed: list[int] = []

        def end(host: HostConnection) -> None:
            if host.close(grace):
                killed.append(host.index)
            self._route(host.index, {"op": "died", "id": None, "reason": reason}, b"")

        threads = [threading.Thread(target=end, args=(self.hosts[i],), daemon=True, name=f"tpunb-end-{i}")
                   for i in indices]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return sorted(killed)

    # -- liveness -----------------------------------------------------------------------------
    def beat_interval(self) -> float:
        """How often agents beat for this timeout: every second, or four times per timeout."""
        return min(BEAT_INTERVAL, self.heartbeat_timeout / 4) if self.heartbeat_timeout else 0.0

    def set_heartbeat_timeout(self, seconds: float) -> None:
        """A new timeout, and the beat pace that goes with it on every running host."""
        self.heartbeat_timeout = seconds
        for host in self.hosts:
            if host.alive:
                host.heard_at = time.monotonic()  # the new bound counts from now
                try:
                    host.send({"op": "heartbeat", "seconds": self.beat_interval()})
                except TransportError:
                    pass

    def check_liveness(self, now: float | None = None) -> list[int]:
        """End hosts silent for longer than ``heartbeat_timeout``; the hosts ended now."""
        timeout = self.heartbeat_timeout
        if not timeout or self.closed:
            return []
        now = time.monotonic() if now is None else now
        ended = []
        for host in self.hosts:
            silence = now - host.heard_at
            if host.alive and silence > timeout and not host.has_unread():
                reason = f"stopped answering (no heartbeat for {silence:.0f} s)"
                if host.give_up(reason, notice=True):  # a cell that sees it happen takes the notice
                    ended.append(host.index)
                    self._route(host.index, {"op": "died", "id": None, "reason": reason}, b"")
        return ended

    def excuse_silence(self, now: float) -> None:
        """This kernel itself did not run for a while (suspended, its GIL held): hosts get a fresh
        window, since their frames could not be read meanwhile."""
        for host in self.hosts:
            host.heard_at = max(host.heard_at, now)

    def take_notices(self) -> dict[int, str]:
        """Hosts ended while no cell ran, with why; each is told once."""
        notices = {h.index: h.notice for h in self.hosts if h.notice}
        for host in self.hosts:
            host.notice = None
        return notices

    def take_jax_failures(self) -> dict[int, str]:
        """Hosts that failed to join JAX in the background, with why; each is told once."""
        failures = {}
        while True:
            try:
                index, error = self.jax_failures.get_nowait()
            except queue.Empty:
                return failures
            failures[index] = error

    def dead_hosts(self) -> list[int]:
        return [h.index for h in self.hosts if not h.alive]

    # -- routing ------------------------------------------------------------------------------
    def _route(self, index: int, message: dict, blob: bytes) -> None:
        op = message.get("op")
        if op == "metrics":  # samples belong to no request: straight to the slice's store
            if self.on_metrics is not None:
                self.on_metrics(index, message)
            return
        if op == "event":
            kind = message.get("kind")
            if kind == "jax_starting":
                self._start_jax_everywhere(index)
            elif kind == "jax_failed" and message.get("background"):  # no cell of that host shows it
                self.jax_failures.put((index, message.get("error") or "no reason given"))
        if op == "died":
            with self._waiters_lock:
                waiters = list(self._waiters.values())
            for waiter in waiters:
                waiter.put((index, message, blob))
            return
        waiter = self._waiters.get(message.get("id"))
        if waiter is not None:
            waiter.put((index, message, blob))
        elif op != "part":  # a piece of a value nobody waits for any more (Ctrl-C) is dropped
            self.backlog.put((index, message, blob))

    def start_jax_everywhere(self) -> None:
        """Every host joins jax.distributed now, in the background (fresh sessions of a slice that ran JAX)."""
        self._start_jax_everywhere(None)

    def _start_jax_everywhere(self, origin: int | None) -> None:
        """One host imported jax: the others must join jax.distributed now, or it waits forever."""
        self.jax_started = True
        for host in self.hosts:
            if host.index != origin and host.alive:
                try:
                    host.send({"op": "start_jax"})
                except TransportError:
                    pass  # its connection is gone: its death reaches the session, which says it

    def _request(self, ctrl_c: CtrlC | None = None, sink: OutputSink | None = None,
                 results: dict[int, HostResult] | None = None) -> Request:
        """A new request whose frames are routed to its inbox until ``_forget``."""
        request = Request(next(self._ids), Inbox(), ctrl_c, sink or OutputSink(), results if results is not None else {})
        with self._waiters_lock:
            self._waiters[request.rid] = request.inbox
        return request

    def _forget(self, rid: int) -> None:
        with self._waiters_lock:
            self._waiters.pop(rid, None)

    # -- cells --------------------------------------------------------------------------------
    def execute(self, code: str, indices: list[int], timeout: float | None = None,
                sink: OutputSink | None = None, shell: bool = False, count: int | None = None) -> dict[int, HostResult]:
        """Run ``code`` on these hosts at once; per-host results, whatever happened.

        Raises CellInterrupted (carrying the results) only when the kernel itself is
        interrupted; timeouts and dead hosts are reported in the results. ``count`` names the
        cell on every host alike (the notebook's cell number; by default the session's own).
        """
        results = {i: HostResult(i) for i in indices}
        message = {"op": "shell", "command": code} if shell else {"op": "exec", "code": code, "count": count or next(self._cells),
                                                                    "colors": self.colors}
        stopped = ""
        with CtrlC() as ctrl_c:
            request = self._request(ctrl_c, sink, results)
            rid, pending = request.rid, request.pending
            try:
                frames = Broadcast({**message, "id": rid})  # encoded once per kind of host, whatever their number
                for i in indices:
                    host = self.hosts[i]
                    if not host.alive:  # it died after the revive looked, its "died" routed before this
                        pending.add(i)  # request waited: this cell reports it and stops the others
                        request.inbox.put((i, {"op": "died", "id": rid, "reason": host.died_reason or "its agent ended"}, b""))
                        continue
                    try:
                        host.send_frame(frames.for_host(host))
                        pending.add(i)
                    except TransportError as exc:
                        results[i].status, results[i].detail = "died", str(exc)
                deadline = time.monotonic() + timeout if timeout else None
                try:
                    self._collect(request, deadline)
                except _Deadline:
                    stopped = "timeout"
                except _HostDied:
                    stopped = "died"
                except (_Interrupt, KeyboardInterrupt):
                    stopped = "interrupted"
                if stopped:
                    self._stop(request, stopped)
            finally:
                self._forget(rid)
        if stopped == "interrupted":
            raise CellInterrupted("the cell was interrupted on every host", results)
        return results

    def _collect(self, request: Request, deadline: float | None, until: int = 1, stop_on_death: bool = True) -> None:
        """Apply frames until no host is pending; raises _Deadline, _HostDied or _Interrupt (once
        Ctrl-C was pressed ``until`` times in this cell) to stop early; a press that only ends a
        wait (``until`` > 1) does so after PRESS_FLOOR seconds of it, so hosts that stop when asked
        are not killed by a burst of presses. The sink ticks every 0.1 s, however busy the hosts."""
        inbox, ctrl_c, pending, results, sink = request.inbox, request.ctrl_c, request.pending, request.results, request.sink
        ticked = began = time.monotonic()
        while pending:
            if ctrl_c is not None and ctrl_c.presses >= until and (until == 1 or time.monotonic() - began >= PRESS_FLOOR):
                raise _Interrupt()
            now = time.monotonic()
            wait = 0.1 if deadline is None else max(0.0, min(0.1, deadline - now))
            try:
                index, message, blob = inbox.get(wait, ctrl_c)
            except (queue.Empty, Wake):
                index = None
            now = time.monotonic()
            if index is None or now - ticked >= 0.1:
                ticked = now
                sink.tick()
            if deadline is not None and now >= deadline:
                raise _Deadline()
            if index is None or index not in results:
                continue
            self._apply(index, message, results[index], sink, pending)
            if message.get("op") == "died" and stop_on_death and pending:
                raise _HostDied()

    def _apply(self, index: int, message: dict, result: HostResult, sink: OutputSink, pending: set) -> None:
        op = message.get("op")
        if op == "stream":
            name = "stderr" if message["name"] == "stderr" else "stdout"
            tail = result.tails.get(name)
            if tail is None:
                tail = result.tails[name] = Tail()
            tail.add(message["text"])
            sink.stream(index, message["name"], message["text"])
        elif op == "display":
            result.displays.append(message["data"])
            if len(result.displays) > KEEP_DISPLAYS:
                del result.displays[0]
            sink.display(index, message["data"], message.get("metadata") or {})
        elif op == "result":
            result.value = message["data"]
        elif op == "error":
            result.error = {k: message[k] for k in ("ename", "evalue", "traceback")}
        elif op == "event":
            sink.event(index, message)
        elif op == "done":
            if result.status == "running":
                result.status = message.get("status") or "ok"
            result.seconds = message.get("seconds")
            result.exit_code = message.get("exit_code")
            if message.get("exiting"):  # exit() in the cell: the next cell starts a fresh session
                self.hosts[index].alive = False
                self.hosts[index].died_reason = "exit() in a cell"
            pending.discard(index)
            sink.host_done(index)
        elif op == "died" and index in pending:
            result.status, result.detail = "died", message.get("reason", "")
            self.hosts[index].notice = None  # this cell reports it
            pending.discard(index)
            sink.host_done(index)

    def _stop(self, request: Request, why: str) -> None:
        """Interrupt the hosts still running, then escalate on those that do not stop. Each further
        Ctrl-C ends the current wait: interrupt, SIGTERM, SIGKILL, give up."""
        pending, results = request.pending, request.results
        frames = Broadcast({"op": "interrupt", "id": request.rid})
        for i in list(pending):
            try:
                self.hosts[i].send_frame(frames.for_host(self.hosts[i]))
            except TransportError:
                pass
        marked = set(pending)
        presses = 1 if why == "interrupted" else 0  # the press that stopped the cell
        if not self._wait(request, self.interrupt_grace, presses + 1):
            if self.before_escalation is not None and request.pending and request.results:
                self.before_escalation(sorted(request.pending), request.sink, request.results)
            self._escalate(request, presses + 2)
        for i in marked:
            if results[i].status == "interrupted" and why == "timeout":
                results[i].status = "timeout"

    def _wait(self, request: Request, seconds: float, until: int) -> bool:
        """Collect for up to ``seconds``; False if hosts are still pending (or Ctrl-C was pressed
        ``until`` times)."""
        try:
            self._collect(request, time.monotonic() + seconds, until, stop_on_death=False)
        except (_Deadline, _Interrupt, KeyboardInterrupt):
            return False
        return not request.pending

    def _escalate(self, request: Request, until: int) -> None:
        """SIGTERM, then SIGKILL, sent to every stuck host at once (a kill over a frozen connection
        takes seconds); hosts still pending after that are given up without waiting on them."""
        pending, results = request.pending, request.results
        stuck = sorted(pending)
        for step, sig in enumerate((signal.SIGTERM, signal.SIGKILL)):
            for i in sorted(pending):
                threading.Thread(target=self.hosts[i].signal, args=(sig,), daemon=True,
                                 name=f"tpunb-signal-{i}").start()
            if self._wait(request, self.term_grace, until + step):
                break
        for i in stuck:
            results[i].status = "killed"
            results[i].detail = "did not stop when interrupted and was killed"
        for i in sorted(pending):  # unreachable even by SIGKILL (frozen, or its connection): give it up
            self.hosts[i].give_up("did not stop when interrupted and was killed")
            pending.discard(i)
            request.sink.host_done(i)

    # -- data ---------------------------------------------------------------------------------
    def call(self, indices: list[int], message: dict, blob: bytes = b"", timeout: float = 60.0,
             segments: list[memoryview] | None = None) -> dict[int, tuple[dict, Any]]:
        """A short request to several hosts; raises TransportError naming hosts that failed.
        ``segments``: a value sent with it (tpunb.engine.transfer). Replies that carry a value
        come back as (reply, value)."""
        with CtrlC() as ctrl_c:
            request = self._request(ctrl_c)
            moving = Transfer(request.rid, request.inbox, ctrl_c, message["op"])
            try:
                return self._call(request, indices, message, blob, timeout, moving, segments)
            finally:
                moving.close()
                self._forget(request.rid)

    def _call(self, request: Request, indices: list[int], message: dict, blob: bytes, timeout: float,
              moving: Transfer, segments: list[memoryview] | None) -> dict[int, tuple[dict, Any]]:
        inbox, ctrl_c, pending = request.inbox, request.ctrl_c, request.pending
        replies: dict[int, tuple[dict, Any]] = {}
        for i in indices:  # a host that died before this request waited: its "died" went to no one
            if not self.hosts[i].alive:
                raise HostDiedError(f"host {i} died ({self.hosts[i].died_reason or 'its agent ended'})")
        hosts = [self.hosts[i] for i in indices]
        pending.update(indices)
        if segments is not None:  # a pushed value is pickled once, sent without copies
            if not moving.send(hosts, message, segments):
                raise CellInterrupted(f"interrupted while sending {message['op']}")
        else:
            frames = Broadcast({**message, "id": request.rid}, blob)
            for host in hosts:
                host.send_frame(frames.for_host(host))
        deadline = time.monotonic() + timeout
        while pending:
            if ctrl_c.presses:
                moving.stop([self.hosts[i] for i in pending])
                raise CellInterrupted(f"interrupted while hosts {sorted(pending)} were answering {message['op']}")
            try:
                index, reply, data = inbox.get(max(0.0, min(0.1, deadline - time.monotonic())), ctrl_c)
            except Wake:
                continue
            except queue.Empty:
                if time.monotonic() < deadline or moving.meter.done > moving.seen:
                    moving.seen = moving.meter.done  # bytes still flow: the wait goes on
                    deadline = max(deadline, time.monotonic() + 1.0)
                    continue
                raise TransportError(f"hosts {sorted(pending)} did not answer {message['op']} "
                                     f"within {timeout:.0f} s") from None
            if reply.get("op") == "died" and index in pending:
                self.hosts[index].notice = None
                raise HostDiedError(f"host {index} died ({reply.get('reason')})")
            if reply.get("op") == "part" and index in pending:
                moving.take_part(index, reply, data)
            elif reply.get("op") == "done" and reply.get("unshared") and index in pending:
                self.hosts[index].info["unshared"] = True  # it cannot map our memfds: parts, now and later
                moving.stream(self.hosts[index])
            elif reply.get("op") == "done" and index in pending:
                replies[index] = (reply, moving.value(self.hosts[index], reply, data) if "sizes" in reply else data)
                pending.discard(index)
        return replies

    def push(self, values: dict[str, Any], indices: list[int]) -> None:
        segments = pack(values)
        sizes = [len(s) for s in segments]
        if relay.wanted(self, sum(sizes), indices) and relay.push(self, segments, indices):  # sent once, passed on
            return
        if sum(sizes) <= INLINE:  # one frame, encoded once for every host
            replies = self.call(indices, {"op": "push", "sizes": sizes, "inline": True}, join(segments))
        else:
            replies = self.call(indices, {"op": "push"}, segments=segments)
        failed = {i: r["error"] for i, (r, _) in replies.items() if r.get("status") != "ok"}
        if failed:
            raise TransportError("push failed on " + "; ".join(f"host {i}: {e}" for i, e in failed.items()))

    def pull(self, names: list[str], indices: list[int]) -> dict[int, dict[str, Any]]:
        return self._values(indices, {"op": "pull", "names": names})

    def gather(self, name: str, indices: list[int]) -> dict[int, dict[str, Any]]:
        """{host: its owned shards of the global jax.Array ``name``} (tpunb.engine.gather assembles)."""
        return self._values(indices, {"op": "gather", "name": name})

    def _values(self, indices: list[int], message: dict) -> dict[int, Any]:
        """{host: value of its reply} of a request that fetches values (by memfd from hosts on this
        machine); RemoteError names failed hosts."""
        local = all(shares_memory(self.hosts[i]) for i in indices)
        replies = self.call(indices, {**message, "shm": True} if local else message)
        out, failed = {}, {}
        for i, (reply, value) in sorted(replies.items()):
            if reply.get("status") != "ok":
                failed[i] = reply.get("error") or reply.get("status")
            else:
                out[i] = value
        if failed:
            raise RemoteError("; ".join(f"host {i}: {e}" for i, e in failed.items()))
        return out


def _watch(session_ref: "weakref.ref[Session]", stop: threading.Event) -> None:
    """The liveness watch of one session, until it is closed or collected."""
    last = time.monotonic()
    while not stop.wait(WATCH_PERIOD):
        session = session_ref()
        if session is None:
            return
        now = time.monotonic()
        if now - last > WATCH_PERIOD + 1.0:  # we were not running ourselves: judge no host on that
            session.excuse_silence(now)
        else:
            session.check_liveness(now)
        last = now
        del session


class _Deadline(Exception):
    pass


class _HostDied(Exception):
    pass


class _Interrupt(Exception):
    pass


