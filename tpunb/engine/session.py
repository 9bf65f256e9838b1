"""Persistent agents on every host of a slice, and the requests that fan out to them.

A Session owns one HostConnection per host and routes each agent's frames to the request they
belong to (``tpunb.engine.request``, whose one wait loop owns deadlines, deaths, Ctrl-C,
escalation and the grace the other hosts get); local hosts' frames are all read by one thread (a
selector over their pipes, ``tpunb.transport.fanin``), hosts over SSH each have a reader thread of
their own. Its clients of that request: ``cell``/``execute`` (a cell: output to a sink as it
arrives, per-host results), ``call`` (a short request, maybe with a value), ``push`` (direct, or
by relay: ``tpunb.engine.relay``), ``pull`` and ``gather``.

Liveness: agents send a frame at least every second (a ``beat`` when they have nothing else to
say), so a host silent for ``heartbeat_timeout`` seconds is frozen (a stopped process, a stopped
sshd session, a dead or half-open connection): a watch thread ends it and fails its cell, during
a cell or between cells, without waiting for anyone to press interrupt.
"""
from __future__ import annotations

import itertools
import os
import queue
import threading
import time
import weakref
from typing import Any, Callable, Iterable

from tpunb.display.sink import OutputSink
from tpunb.engine.connection import HostConnection
from tpunb.engine.relay import Relay
from tpunb.engine.request import OnStuck, OnTick, Request, Requests
from tpunb.engine.routes import Frame, Memfd, Parts
from tpunb.engine.transfer import Incoming, pack, pack_small, shares_memory
from tpunb.errors import CellInterrupted, HostDiedError, HostSetupError, RemoteError, TransportError
from tpunb.engine.masking import Masker
from tpunb.transport.fanout import FanOutTimeout, fan_out
from tpunb.host.protocol import MAIN_THREAD_OPS
from tpunb.host.transfer import INLINE, join
from tpunb.results import KEEP_DISPLAYS, HostResult, Tail
from tpunb.transport.seam import Transport
from tpunb.transport.forkserver import LocalForks
from tpunb.transport.fanin import FanIn

#: how often the watch thread looks at every host's last frame
WATCH_PERIOD = 0.25
#: seconds of silence after which a host counts as frozen, unless $TPUNB_HEARTBEAT_TIMEOUT says (0: never)
HEARTBEAT_TIMEOUT = 5.0
#: how long a host that said it loads JAX may be silent: jaxlib's load and the backend's start hold
#: the GIL (seconds on a busy 2-core machine, a cold disk, or a large libtpu), so heartbeats stop
JAX_LOAD_SILENCE = 60.0
#: agents beat this often (or more often, for short timeouts)
BEAT_INTERVAL = 1.0
#: once one host's environment cannot be made, how long the others get to say whether theirs can
SETUP_GRACE = 3.0


def default_heartbeat_timeout() -> float:
    try:
        seconds = float(os.environ.get("TPUNB_HEARTBEAT_TIMEOUT", HEARTBEAT_TIMEOUT))
    except ValueError:
        return HEARTBEAT_TIMEOUT
    return seconds if seconds > 0 else 0.0


class Session:
    """Persistent agents on every host of a slice, and the requests that fan out to them."""

    #: how long interrupted hosts get to stop before SIGTERM, and SIGTERM before SIGKILL
    interrupt_grace = 3.0
    term_grace = 2.0

    def __init__(self, transports: list[Transport], init_for_host: Callable[[int], dict],
                 start_timeout: float = 120.0, masker: Masker | None = None, forks: LocalForks | None = None) -> None:
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
        #: the kernel's fork server of local agents (None: every agent starts as a fresh process)
        self.forks = forks
        self.hosts = [HostConnection(i, t, self._route, self.fanin, forks) for i, t in enumerate(transports)]
        #: the requests in flight, by id: where their frames go
        self.requests = Requests()
        self.backlog: queue.Queue = queue.Queue()  # frames outside any request (stray output)
        self.jax_started = False
        #: (host, error) of hosts that failed to join JAX when another host started it, not yet said
        self.jax_failures: queue.SimpleQueue[tuple[int, str]] = queue.SimpleQueue()
        self._cells = itertools.count(1)  # one number per cell, the same on every host
        self.colors: str | None = None  # the traceback colour scheme hosts use (the kernel's)
        self.on_metrics: Callable[[int, dict], None] | None = None  # (host, metrics frame)
        #: told each step while hosts' environments are made (host, its ``prepare`` frame)
        self.on_prepare: Callable[[int, dict], None] | None = None
        #: pushes by relay: the hosts' listeners, the link's round trip, the secret hosts prove
        self.relay = Relay(self.hosts, self.request, self.call)
        #: what every cell request does by default (``cell``): see tpunb.engine.request.OnStuck / OnTick
        self.on_stuck: OnStuck | None = None
        self.on_tick: OnTick | None = None
        #: the kernel's secrets, masked in every frame a host sends before it goes anywhere
        self.masker = masker or Masker()

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self, indices: Iterable[int] | None = None, ready: dict[int, HostConnection] | None = None) -> None:
        """Start agents on these hosts (default all) in parallel; one start at a time. ``ready``:
        agents already started for some of them (launched, not yet told their settings), which
        take those hosts' places (a restart's standbys)."""
        with self._start_lock:
            self._start(indices, ready or {})
        if not self._watching:
            self._watching = True
            threading.Thread(target=_watch, args=(weakref.ref(self), self._watch_stop), daemon=True,
                             name="tpunb-liveness").start()

    def _start(self, indices: Iterable[int] | None, ready: dict[int, HostConnection]) -> None:
        """Every chosen host at once: its agent started, shipped and told its settings (over SSH
        each step waits on the host, so hosts overlap their round trips); a host in ``ready`` takes
        its standby agent, already started, which only needs its settings. When one host's
        environment cannot be made, the others get SETUP_GRACE seconds to say whether theirs can,
        then the start ends, naming every host that failed and why."""
        if self.closed:
            raise TransportError("this slice's host sessions were closed")
        for i, standby in ready.items():
            self.hosts[i].close()
            standby.router = self._route  # from now on its frames and its death are the session's
            self.hosts[i] = standby
        chosen = [self.hosts[i] for i in (indices if indices is not None else range(len(self.hosts)))]
        beat = self.beat_interval()

        def start(host: HostConnection) -> None:
            init = {**self.init_for_host(host.index), "heartbeat": beat, "relay_secret": self.relay.secret}
            if host.index not in ready:
                host.close()
                host.on_prepare = self.on_prepare
                host.launch(init)
                if self.closed:  # closed meanwhile (a Ctrl-C ended the wait): close() may have missed this agent
                    host.close()
                    raise TransportError("this slice's host sessions were closed while starting")
            host.handshake(init, self.start_timeout)

        started = fan_out(chosen, start, name="tpunb-start", after_failure=SETUP_GRACE)
        # the errors are reported together; hosts still starting when another failed are closed below
        errors = [e for e in started.failed.values() if not isinstance(e, (FanOutTimeout, KeyboardInterrupt))]
        if self.closed and not errors:  # closed (the slice deleted) while these started: end them too
            errors.append(TransportError("this slice's host sessions were closed while starting"))
        if errors:
            for host in chosen:
                host.close()
            setup = [e for e in list(errors) if isinstance(e, HostSetupError)]
            if setup:
                raise HostSetupError.merge(setup)
            raise errors[0] if len(errors) == 1 else TransportError("; ".join(str(e) for e in errors))

    def close(self) -> None:
        """End every host's agent, then its connection (in parallel: each may wait a moment for its
        agent to exit)."""
        self.closed = True
        self._watch_stop.set()

        def end(host: HostConnection) -> None:
            host.close()
            host.transport.close()

        fan_out(self.hosts, end, name="tpunb-end")
        self.fanin.close()

    def end_agents(self, indices: list[int], grace: float, reason: str) -> list[int]:
        """End these hosts' agents at once (end of input; killed if not gone within ``grace``), and
        tell requests still waiting on them why; the hosts that had to be killed."""
        def end(i: int) -> bool:
            process = self.hosts[i].detach(reason)
            # a request still waiting on it (in an interrupt's grace, say) learns why now, not once it exited
            self._route(i, {"op": "died", "id": None, "reason": reason}, b"")
            return process.close(grace) if process is not None else False

        return sorted(i for i, killed in fan_out(indices, end, name="tpunb-end").succeeded.items() if killed)

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
            if host.alive and silence > timeout and now >= host.quiet_until and not host.has_unread():
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
        if not self.masker.active:
            self._route_one(index, message, blob)
            return
        for masked in self.masker.frames(index, message):  # held stream text first (streams carry no blob)
            self._route_one(index, masked, b"" if masked.get("op") == "stream" else blob)

    def _route_one(self, index: int, message: dict, blob: bytes) -> None:
        op = message.get("op")
        if op == "metrics":  # samples belong to no request: straight to the slice's store
            if self.on_metrics is not None:
                self.on_metrics(index, message)
            return
        if op == "event":
            kind = message.get("kind")
            if kind == "jax_loading":  # its heartbeats may stop while jaxlib loads and the backend starts
                self.hosts[index].quiet_until = time.monotonic() + JAX_LOAD_SILENCE
            elif kind == "jax_starting":
                self._start_jax_everywhere(index)
            elif kind == "jax_failed":
                self.hosts[index].quiet_until = 0.0
                if message.get("background"):  # no cell of that host shows it
                    self.jax_failures.put((index, message.get("error") or "no reason given"))
        if op == "died":
            self.requests.tell_all((index, message, blob))
        elif not self.requests.deliver(message.get("id"), (index, message, blob)) and op != "part":
            self.backlog.put((index, message, blob))  # a piece of a value nobody waits for any more (Ctrl-C) is dropped

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

    # -- requests -----------------------------------------------------------------------------
    def request(self, hosts: Iterable[int], *, kind: str = "request", timeout: float | None = None,
                sink: OutputSink | None = None, grace: float = 0.0, escalate: bool = False,
                exclusive: bool | None = None, on_tick: OnTick | None = None, on_stuck: OnStuck | None = None,
                body: Callable[[Request], Any] | None = None) -> Request:
        """A request to these hosts (``tpunb.engine.request``): send it along routes and collect
        the replies inside ``with``, or give it a ``body`` to ``run()`` or ``start()``.
        ``exclusive`` (default: by ``kind``) says it takes the hosts' main thread."""
        return Request(self.hosts, self.requests, hosts, kind=kind, timeout=timeout, sink=sink, grace=grace,
                       escalate=escalate, term_grace=self.term_grace,
                       exclusive=kind in MAIN_THREAD_OPS if exclusive is None else exclusive,
                       on_tick=on_tick, on_stuck=on_stuck, body=body)

    def holding(self, hosts: Iterable[int]) -> list[Request]:
        """Requests that hold the main thread of any of these hosts (a running cell, a push, a cell
        that claimed them and is reviving them), oldest first: a second cell there would wait
        behind them. The one answer to "are these hosts busy" (``Requests.claim`` takes them)."""
        return self.requests.holding(hosts)

    # -- cells --------------------------------------------------------------------------------
    def cell(self, code: str, indices: list[int], timeout: float | None = None, sink: OutputSink | None = None,
             shell: bool = False, count: int | None = None, on_tick: OnTick | None = None,
             on_stuck: OnStuck | None = None) -> Request:
        """A cell's request, not started: ``run()`` it here (``execute``) or ``start()`` it on a
        thread. Its result is ``{host: HostResult}``, whatever happened; it raises CellInterrupted
        (carrying the results) only when interrupted (Ctrl-C, ``interrupt()``). ``count`` names the
        cell on every host alike (the notebook's cell number; by default the session's own)."""
        message = {"op": "shell", "command": code} if shell else {"op": "exec", "code": code, "count": count or next(self._cells),
                                                                    "colors": self.colors}
        results = {i: HostResult(i) for i in indices}
        sink = sink or OutputSink()

        def body(request: Request) -> dict[int, HostResult]:
            request.send(Frame(message))  # encoded once per kind of host, whatever their number
            request.collect(self._applier(results, request.sink))
            for i in request.killed:
                results[i].status = "killed"
                results[i].detail = "did not stop when interrupted and was killed"
            if request.stopped == "timeout":
                for i in request.stopped_hosts:
                    if results[i].status == "interrupted":
                        results[i].status = "timeout"
            if request.stopped == "interrupted":
                raise CellInterrupted("the cell was interrupted on every host", results)
            return results

        return self.request(indices, kind=message["op"], timeout=timeout, sink=sink, grace=self.interrupt_grace,
                            escalate=True, on_tick=on_tick or self.on_tick, on_stuck=on_stuck or self.on_stuck,
                            body=body)

    def execute(self, code: str, indices: list[int], timeout: float | None = None,
                sink: OutputSink | None = None, shell: bool = False, count: int | None = None) -> dict[int, HostResult]:
        """Run ``code`` on these hosts at once, here; per-host results, whatever happened (``cell``).

        Raises CellInterrupted (carrying the results) only when the kernel itself is
        interrupted; timeouts and dead hosts are reported in the results.
        """
        return self.cell(code, indices, timeout, sink, shell, count).run()

    def _applier(self, results: dict[int, HostResult], sink: OutputSink) -> Callable[[int, dict, Any], bool]:
        """A cell's reply handler: each frame into its host's result and the sink; True once the
        host is done."""
        hosts = self.hosts

        def apply(index: int, message: dict, blob: Any) -> bool:
            op, result = message.get("op"), results[index]
            if op == "done":
                if result.status == "running":
                    result.status = message.get("status") or "ok"
                result.seconds = message.get("seconds")
                result.exit_code = message.get("exit_code")
                if message.get("exiting"):  # exit() in the cell: the next cell starts a fresh session
                    hosts[index].alive = False
                    hosts[index].died_reason = "exit() in a cell"
                return True
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
            elif op == "died":
                result.status, result.detail = "died", message.get("reason", "")
            return False

        return apply

    # -- data ---------------------------------------------------------------------------------
    def call(self, indices: list[int], message: dict, blob: bytes = b"", timeout: float = 60.0,
             segments: list[memoryview] | None = None) -> dict[int, tuple[dict, Any]]:
        """A short request to several hosts; raises TransportError naming hosts that failed.
        ``segments``: a value sent with it (tpunb.engine.transfer): by memfd to hosts on this
        machine, as parts to the others. Replies that carry a value come back as (reply, value)."""
        for i in indices:  # a host that died before this request waited: its "died" went to no one
            if not self.hosts[i].alive:
                raise HostDiedError(f"host {i} died ({self.hosts[i].died_reason or 'its agent ended'})")
        replies: dict[int, tuple[dict, Any]] = {}
        with self.request(indices, kind=message["op"], timeout=timeout) as request:
            incoming = Incoming(lambda: request.meter)

            def answer(index: int, reply: dict, data: Any) -> bool:
                op = reply.get("op")
                if op == "done":
                    if reply.get("unshared"):  # it cannot map our memfds: parts, now and later
                        self.hosts[index].info["unshared"] = True
                        request.send(Parts(message, segments), [index])
                        return False
                    replies[index] = (reply, incoming.value(self.hosts[index], reply, data) if "sizes" in reply else data)
                    return True
                if op == "part":
                    incoming.take_part(index, reply, data)
                return False

            if segments is None:
                request.send(Frame(message, blob))
            else:  # a pushed value is pickled once, sent without copies
                shared = [i for i in indices if shares_memory(self.hosts[i])]
                streamed = [i for i in indices if i not in shared]
                if streamed:
                    request.send(Parts(message, segments), streamed)
                if shared:
                    request.send(Memfd(message, segments), shared)
            request.collect(answer)
        request.raise_for_stop()
        return replies

    def push(self, values: dict[str, Any], indices: list[int]) -> None:
        small = pack_small(values)
        if small is not None:  # one plain pickle in one frame, encoded once for every host
            replies = self.call(indices, {"op": "push", "sizes": [len(small)], "inline": True}, small)
        else:
            segments = pack(values)
            sizes = [len(s) for s in segments]
            if self.relay.wanted(sum(sizes), indices) and self.relay.push(segments, indices):  # sent once, passed on
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

