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

import collections
import itertools
import marshal
import os
import pickle
import queue
import signal
import sys
import threading
import time
import warnings
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from tpunb.errors import CellInterrupted, HostDiedError, ProtocolError, RemoteError, TransportError, UsageError
from tpunb.transport.fanin import FanIn, Frames, Stream
from tpunb.host import protocol
from tpunb.host.bundle import BOOTSTRAP, agent_bundle
from tpunb.host.runners import cell_filename, compile_cell
from tpunb.transport.base import AgentProcess, Transport

#: how often the watch thread looks at every host's last frame
WATCH_PERIOD = 0.25
#: seconds of silence after which a host counts as frozen, unless $TPUNB_HEARTBEAT_TIMEOUT says (0: never)
HEARTBEAT_TIMEOUT = 5.0
#: agents beat this often (or more often, for short timeouts)
BEAT_INTERVAL = 1.0
#: a further Ctrl-C ends an escalation step once it lasted this long
PRESS_FLOOR = 1.0
_CHUNK = 1 << 20  # a large frame is read in pieces, each counting as a sign of life
#: marshal frames with agents that run this same Python (False: JSON with every host, as with others)
MARSHAL_FRAMES = True


def default_heartbeat_timeout() -> float:
    try:
        seconds = float(os.environ.get("TPUNB_HEARTBEAT_TIMEOUT", HEARTBEAT_TIMEOUT))
    except ValueError:
        return HEARTBEAT_TIMEOUT
    return seconds if seconds > 0 else 0.0


#: how much of each host's stdout and stderr a result keeps in memory (the logs keep everything)
TAIL_CHARS = 1 << 20
#: how many of a cell's displays a result keeps (the newest)
KEEP_DISPLAYS = 100


class Tail:
    """The last ``limit`` characters of a stream; adding is O(len(text)), whatever came before."""

    def __init__(self, limit: int = TAIL_CHARS) -> None:
        self.limit = limit
        self._chunks: list[str] = []
        self._size = 0
        self.total = 0  # characters ever added

    def add(self, text: str) -> None:
        self._chunks.append(text)
        self._size += len(text)
        self.total += len(text)
        if self._size > 2 * self.limit:
            self._compact()

    def _compact(self) -> None:
        joined = "".join(self._chunks)[-self.limit:]
        self._chunks, self._size = [joined], len(joined)

    @property
    def truncated(self) -> bool:
        return self.total > self.limit

    def __str__(self) -> str:
        if len(self._chunks) > 1 or self._size > self.limit:
            self._compact()
        return self._chunks[0] if self._chunks else ""


_NO_TEXT = Tail()  # what a stream that printed nothing reads as (never added to)


@dataclass
class HostResult:
    """What one host did with one cell. ``stdout``/``stderr`` are the last TAIL_CHARS characters
    (``stdout_truncated`` says when more came); the host's log file has all of it."""

    host: int
    status: str = "running"  # ok | error | interrupted | timeout | died | killed | not run
    value: dict | None = None  # the last expression's mime bundle ({"text/plain": ...})
    displays: list[dict] = field(default_factory=list)  # the newest KEEP_DISPLAYS
    error: dict | None = None  # {"ename", "evalue", "traceback": [lines]}
    seconds: float | None = None
    detail: str = ""  # why a host died or was killed
    exit_code: int | None = None  # shell commands (%tpu_run)
    #: made at a stream's first text: most hosts of most cells print nothing (256 results a cell)
    tails: dict[str, Tail] = field(default_factory=dict, repr=False)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def stdout(self) -> str:
        return str(self.tails.get("stdout", _NO_TEXT))

    @property
    def stderr(self) -> str:
        return str(self.tails.get("stderr", _NO_TEXT))

    @property
    def stdout_truncated(self) -> bool:
        return self.tails.get("stdout", _NO_TEXT).truncated

    @property
    def stderr_truncated(self) -> bool:
        return self.tails.get("stderr", _NO_TEXT).truncated


class HostConnection:
    """One host's agent: started once per host session, then reused for every cell."""

    def __init__(self, index: int, transport: Transport, router: Callable[[int, dict, bytes], None],
                 fanin: FanIn | None = None) -> None:
        self.index = index
        self.transport = transport
        self.router = router
        #: reads this host's frames with every other host's on one thread, when its stream is an fd
        self.fanin = fanin
        self._stream: Stream | None = None
        self.process: AgentProcess | None = None
        self.info: dict = {}
        self.alive = False
        self.died_reason = ""
        self.started_at: float | None = None
        #: when the last bytes of this host arrived (time.monotonic)
        self.heard_at = time.monotonic()
        #: why this host was ended while no cell ran (it stopped answering): the next cell says so
        self.notice: str | None = None
        #: frames to and from this host are marshal, not JSON: its agent runs this same Python
        self.fast = False
        self._handshake: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._life = threading.Lock()  # launch, close and give_up of this host's agent, one at a time

    def launch(self) -> None:
        """Start the agent and ship it; the handshake is finished by ``handshake``."""
        with self._life:
            self._handshake = queue.Queue()  # a fresh one: the previous agent may have left "died" in it
            self.transport.connect()  # after a lost connection, the next cell reconnects by itself
            self.process = process = self.transport.spawn([self.transport.python, "-c", BOOTSTRAP])
            self.notice = None
            handshake = self._handshake
            fd = process.frames_fd() if self.fanin is not None else None
            if fd is not None:
                self._stream = self.fanin.add(fd, lambda frames: self._on_frames(handshake, frames),
                                              lambda reason: self._on_end(process, handshake, reason))
        process.send(agent_bundle())
        if fd is None:
            threading.Thread(target=self._read_loop, args=(process, handshake), daemon=True,
                             name=f"tpunb-host-{self.index}").start()

    def handshake(self, init: dict, timeout: float) -> None:
        """Check the protocol version, send the host's settings, wait until it is ready."""
        hello = self._wait_handshake(timeout, "start")
        if hello.get("protocol") != protocol.PROTOCOL_VERSION:
            raise ProtocolError(f"host {self.index} runs agent protocol v{hello.get('protocol')}, "
                                f"this tpunb speaks v{protocol.PROTOCOL_VERSION}: restart the slice")
        self.info = dict(hello)
        self.fast = MARSHAL_FRAMES and hello.get("magic") == protocol.MAGIC
        self.send({"op": "init", **init, "marshal": self.fast})
        ready = self._wait_handshake(timeout, "get ready")
        self.info.update(runner=ready.get("runner"), runner_error=ready.get("runner_error"), inbox=ready.get("inbox"))
        self.heard_at = time.monotonic()
        self.alive = True
        self.started_at = time.time()

    def _wait_handshake(self, timeout: float, what: str) -> dict:
        try:
            message = self._handshake.get(timeout=timeout)
        except queue.Empty:
            raise TransportError(f"host {self.index} ({self.transport.address}) did not {what} "
                                 f"within {timeout:.0f} s") from None
        if message.get("op") == "died":
            if self.process is None:
                raise TransportError(f"host {self.index} ({self.transport.address}) was closed while starting")
            tail = self.process.stderr_tail().strip()
            raise TransportError(f"host {self.index} ({self.transport.address}) failed to start the agent"
                                 + (f": {tail.splitlines()[-1]}" if tail else ""))
        return message

    def send(self, message: dict, blob: bytes = b"") -> None:
        self.send_frame(protocol.encode(message, blob, self.fast))

    def send_frame(self, data: bytes) -> None:
        """Send a frame already encoded (one request to many hosts is encoded once)."""
        process = self.process
        if process is None:
            raise TransportError(f"host {self.index} is not running")
        with self._lock:
            process.send(data)

    def _read_exact(self, process: AgentProcess, n: int) -> bytes:
        """``process.recv_exact``, noting every piece that arrives as a sign of life."""
        if n <= _CHUNK:
            data = process.recv_exact(n)
            self.heard_at = time.monotonic()
            return data
        pieces = []
        while n > 0:
            piece = process.recv_exact(min(n, _CHUNK))
            self.heard_at = time.monotonic()
            if not piece:
                break
            pieces.append(piece)
            n -= len(piece)
        return b"".join(pieces)

    def _read_loop(self, process: AgentProcess, handshake: queue.Queue) -> None:
        """A thread of this host's own, for streams a selector cannot wait on (paramiko channels)."""
        reason = ""
        try:
            while True:
                frame = protocol.read_frame(lambda n: self._read_exact(process, n))
                if frame is None:
                    break
                self._deliver(handshake, *frame)
        except (EOFError, ValueError, TransportError, OSError) as exc:
            reason = f"broken stream: {exc}"
        self._ended(process, handshake, reason)

    def _deliver(self, handshake: queue.Queue, message: dict, blob: bytes) -> None:
        op = message.get("op")
        if op == "beat":
            return
        if op in ("hello", "ready"):
            handshake.put(message)
        else:
            self.router(self.index, message, blob)

    def _on_frames(self, handshake: queue.Queue, frames: Frames) -> None:
        """From the session's FanIn thread: bytes arrived (a sign of life), maybe completing frames."""
        self.heard_at = time.monotonic()
        for message, blob in frames:
            self._deliver(handshake, message, blob)

    def _on_end(self, process: AgentProcess, handshake: queue.Queue, reason: str) -> None:
        """From the FanIn thread: telling why a host died may wait for its exit status, which
        must not hold up every other host's frames."""
        threading.Thread(target=self._ended, args=(process, handshake, reason), daemon=True,
                         name=f"tpunb-host-{self.index}-end").start()

    def _ended(self, process: AgentProcess, handshake: queue.Queue, reason: str) -> None:
        handshake.put({"op": "died"})
        if process is not self.process:
            return  # an old agent that was replaced or closed on purpose
        reason = reason or describe_exit(process)
        if process is not self.process:
            return
        self.died_reason = reason  # before it is seen dead: a cell that finds it so tells why
        self.alive = False
        self.router(self.index, {"op": "died", "id": None, "reason": self.died_reason}, b"")

    def _stop_reading(self) -> None:
        """Before the process's streams are closed (their fd numbers may be reused at once)."""
        stream, self._stream = self._stream, None
        if stream is not None and self.fanin.remove(stream):
            self._handshake.put({"op": "died"})  # a start waiting on it ends now

    def has_unread(self) -> bool:
        """It spoke and this kernel has not read it yet (see ``AgentProcess.has_unread``)."""
        process = self.process
        return process is not None and process.has_unread()

    def signal(self, sig: int) -> None:
        pgid, process = self.info.get("pgid"), self.process
        if process is not None and pgid:
            process.signal_group(pgid, sig)

    def give_up(self, reason: str, notice: bool = False) -> bool:
        """End this host's agent for good without waiting on it (it stopped answering); False if
        it was not running. ``notice``: no cell saw it happen, so the next one says so."""
        with self._life:
            process, self.process = self.process, None
            if process is None:
                return False
            self.died_reason = reason  # before it is seen dead: whoever sees that can tell why
            if notice:
                self.notice = reason
            self.alive = False
            self._stop_reading()
        process.abandon(self.info.get("pgid"))
        return True

    def close(self) -> None:
        with self._life:
            process, self.process = self.process, None
            self.alive = False
            self._stop_reading()
        if process is not None:
            process.close()


def describe_exit(process: AgentProcess, wait: float = 0.5) -> str:
    """'killed by SIGKILL', 'exited with status 1', ... for messages about dead hosts."""
    deadline = time.monotonic() + wait
    status = process.exit_status()
    while status is None and time.monotonic() < deadline:
        time.sleep(0.01)  # the exit status lags the end of stream by microseconds
        status = process.exit_status()
    if status is None:
        return "its connection closed"
    if status < 0:
        try:
            return f"killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"killed by signal {-status}"
    tail = process.stderr_tail().strip()
    return f"exited with status {status}" + (f" ({tail.splitlines()[-1]})" if tail else "")


class OutputSink:
    """Receives a cell's output as it arrives; display.CellOutput renders it for notebooks."""

    def stream(self, host: int, name: str, text: str) -> None: ...
    def display(self, host: int, data: dict, metadata: dict) -> None: ...
    def event(self, host: int, message: dict) -> None: ...
    def tick(self) -> None: ...
    def host_done(self, host: int) -> None: ...
    def finish(self) -> None: ...


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
        self._waiters: dict[int, queue.Queue] = {}
        self._waiters_lock = threading.Lock()
        self.backlog: queue.Queue = queue.Queue()  # frames outside any request (stray output)
        self.jax_started = False
        self._cells = itertools.count(1)  # one number per cell, the same on every host
        self.colors: str | None = None  # the traceback colour scheme hosts use (the kernel's)
        self.on_metrics: Callable[[int, dict], None] | None = None  # (host, metrics frame)

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
                    h.handshake({**self.init_for_host(h.index), "heartbeat": beat}, self.start_timeout)
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

    def dead_hosts(self) -> list[int]:
        return [h.index for h in self.hosts if not h.alive]

    # -- routing ------------------------------------------------------------------------------
    def _route(self, index: int, message: dict, blob: bytes) -> None:
        if message.get("op") == "metrics":  # samples belong to no request: straight to the slice's store
            if self.on_metrics is not None:
                self.on_metrics(index, message)
            return
        if message.get("op") == "event" and message.get("kind") == "jax_starting":
            self._start_jax_everywhere(index)
        if message.get("op") == "died":
            with self._waiters_lock:
                waiters = list(self._waiters.values())
            for waiter in waiters:
                waiter.put((index, message, blob))
            return
        waiter = self._waiters.get(message.get("id"))
        if waiter is not None:
            waiter.put((index, message, blob))
        else:
            self.backlog.put((index, message, blob))

    def _start_jax_everywhere(self, origin: int) -> None:
        """One host imported jax: the others must join jax.distributed now, or it waits forever."""
        self.jax_started = True
        for host in self.hosts:
            if host.index != origin and host.alive:
                try:
                    host.send({"op": "start_jax"})
                except TransportError:
                    pass

    def _request(self) -> tuple[int, "Inbox"]:
        rid = next(self._ids)
        waiter = Inbox()
        with self._waiters_lock:
            self._waiters[rid] = waiter
        return rid, waiter

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
        sink = sink or OutputSink()
        results = {i: HostResult(i) for i in indices}
        rid, waiter = self._request()
        pending = set()
        request = {"op": "shell", "command": code} if shell else {"op": "exec", "code": code, "count": count or next(self._cells),
                                                                    "colors": self.colors}
        stopped = ""
        with CtrlC() as ctrl_c:
            try:
                frames = Broadcast({**request, "id": rid})  # encoded once per kind of host, whatever their number
                for i in indices:
                    host = self.hosts[i]
                    if not host.alive:  # it died after the revive looked, its "died" routed before this
                        pending.add(i)  # request waited: this cell reports it and stops the others
                        waiter.put((i, {"op": "died", "id": rid, "reason": host.died_reason or "its agent ended"}, b""))
                        continue
                    try:
                        host.send_frame(frames.for_host(host))
                        pending.add(i)
                    except TransportError as exc:
                        results[i].status, results[i].detail = "died", str(exc)
                deadline = time.monotonic() + timeout if timeout else None
                try:
                    self._collect(rid, waiter, pending, results, sink, deadline, ctrl_c)
                except _Deadline:
                    stopped = "timeout"
                except _HostDied:
                    stopped = "died"
                except (_Interrupt, KeyboardInterrupt):
                    stopped = "interrupted"
                if stopped:
                    self._stop(rid, waiter, pending, results, sink, stopped, ctrl_c)
            finally:
                self._forget(rid)
        if stopped == "interrupted":
            raise CellInterrupted("the cell was interrupted on every host", results)
        return results

    def _collect(self, rid, waiter, pending, results, sink, deadline, ctrl_c: CtrlC | None = None,
                 until: int = 1, stop_on_death=True) -> None:
        """Apply frames until no host is pending; raises _Deadline, _HostDied or _Interrupt (once
        Ctrl-C was pressed ``until`` times in this cell) to stop early; a press that only ends a
        wait (``until`` > 1) does so after PRESS_FLOOR seconds of it, so hosts that stop when asked
        are not killed by a burst of presses. The sink ticks every 0.1 s, however busy the hosts."""
        ticked = began = time.monotonic()
        while pending:
            if ctrl_c is not None and ctrl_c.presses >= until and (until == 1 or time.monotonic() - began >= PRESS_FLOOR):
                raise _Interrupt()
            now = time.monotonic()
            wait = 0.1 if deadline is None else max(0.0, min(0.1, deadline - now))
            try:
                index, message, blob = waiter.get(wait, ctrl_c)
            except (queue.Empty, _Wake):
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

    def _stop(self, rid, waiter, pending, results, sink, why: str, ctrl_c: CtrlC) -> None:
        """Interrupt the hosts still running, then escalate on those that do not stop. Each further
        Ctrl-C ends the current wait: interrupt, SIGTERM, SIGKILL, give up."""
        frames = Broadcast({"op": "interrupt", "id": rid})
        for i in list(pending):
            try:
                self.hosts[i].send_frame(frames.for_host(self.hosts[i]))
            except TransportError:
                pass
        marked = set(pending)
        presses = 1 if why == "interrupted" else 0  # the press that stopped the cell
        if not self._wait(rid, waiter, pending, results, sink, self.interrupt_grace, ctrl_c, presses + 1):
            self._escalate(rid, waiter, pending, results, sink, ctrl_c, presses + 2)
        for i in marked:
            if results[i].status == "interrupted" and why == "timeout":
                results[i].status = "timeout"

    def _wait(self, rid, waiter, pending, results, sink, seconds: float, ctrl_c: CtrlC, until: int) -> bool:
        """Collect for up to ``seconds``; False if hosts are still pending (or Ctrl-C was pressed
        ``until`` times)."""
        try:
            self._collect(rid, waiter, pending, results, sink, time.monotonic() + seconds, ctrl_c, until,
                          stop_on_death=False)
        except (_Deadline, _Interrupt, KeyboardInterrupt):
            return False
        return not pending

    def _escalate(self, rid, waiter, pending, results, sink, ctrl_c: CtrlC, until: int) -> None:
        """SIGTERM, then SIGKILL, sent to every stuck host at once (a kill over a frozen connection
        takes seconds); hosts still pending after that are given up without waiting on them."""
        stuck = sorted(pending)
        for step, sig in enumerate((signal.SIGTERM, signal.SIGKILL)):
            for i in sorted(pending):
                threading.Thread(target=self.hosts[i].signal, args=(sig,), daemon=True,
                                 name=f"tpunb-signal-{i}").start()
            if self._wait(rid, waiter, pending, results, sink, self.term_grace, ctrl_c, until + step):
                break
        for i in stuck:
            results[i].status = "killed"
            results[i].detail = "did not stop when interrupted and was killed"
        for i in sorted(pending):  # unreachable even by SIGKILL (frozen, or its connection): give it up
            self.hosts[i].give_up("did not stop when interrupted and was killed")
            pending.discard(i)
            sink.host_done(i)

    # -- data ---------------------------------------------------------------------------------
    def call(self, indices: list[int], message: dict, blob: bytes = b"", timeout: float = 60.0) -> dict[int, tuple[dict, bytes]]:
        """A short request to several hosts; raises TransportError naming hosts that failed."""
        rid, waiter = self._request()
        replies: dict[int, tuple[dict, bytes]] = {}
        with CtrlC() as ctrl_c:
            try:
                self._call(rid, waiter, indices, message, blob, timeout, replies, ctrl_c)
            finally:
                self._forget(rid)
        return replies

    def _call(self, rid, waiter, indices, message, blob, timeout, replies, ctrl_c: CtrlC) -> None:
        pending = set()
        frames = Broadcast({**message, "id": rid}, blob)  # a pushed value is pickled once
        for i in indices:  # a host that died before this request waited: its "died" went to no one
            if not self.hosts[i].alive:
                raise HostDiedError(f"host {i} died ({self.hosts[i].died_reason or 'its agent ended'})")
        for i in indices:
            self.hosts[i].send_frame(frames.for_host(self.hosts[i]))
            pending.add(i)
        deadline = time.monotonic() + timeout
        while pending:
            if ctrl_c.presses:
                raise CellInterrupted(f"interrupted while hosts {sorted(pending)} were answering {message['op']}")
            try:
                index, reply, data = waiter.get(max(0.0, min(0.1, deadline - time.monotonic())), ctrl_c)
            except _Wake:
                continue
            except queue.Empty:
                if time.monotonic() < deadline:
                    continue
                raise TransportError(f"hosts {sorted(pending)} did not answer {message['op']} "
                                     f"within {timeout:.0f} s") from None
            if reply.get("op") == "died" and index in pending:
                self.hosts[index].notice = None
                raise HostDiedError(f"host {index} died ({reply.get('reason')})")
            if reply.get("op") == "done" and index in pending:
                replies[index] = (reply, data)
                pending.discard(index)

    def push(self, values: dict[str, Any], indices: list[int]) -> None:
        blob = _dumps(values)
        replies = self.call(indices, {"op": "push"}, blob)
        failed = {i: r["error"] for i, (r, _) in replies.items() if r.get("status") != "ok"}
        if failed:
            raise TransportError("push failed on " + "; ".join(f"host {i}: {e}" for i, e in failed.items()))

    def pull(self, names: list[str], indices: list[int]) -> dict[int, dict[str, Any]]:
        replies = self.call(indices, {"op": "pull", "names": names})
        out, failed = {}, {}
        for i, (reply, blob) in sorted(replies.items()):
            if reply.get("status") != "ok":
                failed[i] = reply.get("error")
            else:
                out[i] = pickle.loads(blob)
        if failed:
            raise RemoteError("; ".join(f"host {i}: {e}" for i, e in failed.items()))
        return out


def _dumps(values: dict) -> bytes:
    """cloudpickle when present (lambdas, notebook classes), else pickle; a value that cannot be
    sent is named in a one-line UsageError (which variable, and why)."""
    try:
        import cloudpickle
        dumps = cloudpickle.dumps
    except ImportError:
        dumps = pickle.dumps
    try:
        return dumps(values, protocol=4)
    except Exception:
        for name, value in values.items():
            try:
                dumps(value, protocol=4)
            except Exception as exc:
                raise UsageError(f"cannot send {name} to the hosts: {type(exc).__name__}: {exc} "
                                 "(send what it is made from, and rebuild it there)") from None
        raise


class Broadcast:
    """One request for many hosts, encoded once for each kind of host: JSON, marshal, and for
    hosts that run cells with plain ``exec`` in this same Python, marshal with the cell compiled
    here (once for the slice, where every host would compile it again)."""

    def __init__(self, message: dict, blob: bytes = b"") -> None:
        self.message, self.blob = message, blob
        self._frames: dict[tuple[bool, bool], bytes] = {}
        self._compiled: bytes | None = None

    def for_host(self, host: "HostConnection") -> bytes:
        precompile = (host.fast and self.message.get("op") == "exec" and host.info.get("runner") == "plain"
                      and host.info.get("optimize") == sys.flags.optimize)  # -O strips asserts when compiling
        key = (host.fast, precompile)
        frame = self._frames.get(key)
        if frame is None:
            compiled = self._compile() if precompile else b""
            message = {**self.message, "compiled": True} if compiled else self.message
            frame = self._frames[key] = protocol.encode(message, compiled or self.blob, host.fast)
        return frame

    def _compile(self) -> bytes:
        """The cell compiled as a plain host would (b"" if it does not compile: the hosts report that)."""
        if self._compiled is None:
            self._compiled = b""
            count = self.message.get("count")
            if count is not None:
                with warnings.catch_warnings():
                    warnings.simplefilter("error")  # a cell that warns is compiled where the warning shows
                    try:
                        self._compiled = marshal.dumps(compile_cell(self.message["code"], cell_filename(count)))
                    except (SyntaxError, Warning, ValueError, OverflowError, RecursionError, MemoryError):
                        pass
        return self._compiled


class Inbox:
    """The frames of one request: reader threads ``put``, the request's thread ``get``s.

    The wait is on a C-level queue of tokens, never on the frames themselves, so a Ctrl-C may end
    a wait at once (CtrlC raises _Wake inside it) without ever losing a frame."""

    def __init__(self) -> None:
        self._items: collections.deque = collections.deque()
        self._bell: queue.SimpleQueue = queue.SimpleQueue()

    def put(self, item) -> None:
        ring = not self._items
        self._items.append(item)
        if ring:
            self._bell.put(None)

    def get(self, timeout: float, ctrl_c: "CtrlC | None" = None):
        """The next frame, waiting up to ``timeout``; queue.Empty if none came."""
        if not self._items:
            if ctrl_c is not None:
                ctrl_c.waiting = True
            try:
                self._bell.get(timeout=timeout)
            except queue.Empty:
                pass
            finally:
                if ctrl_c is not None:
                    ctrl_c.waiting = False
        try:
            return self._items.popleft()
        except IndexError:
            raise queue.Empty from None


class CtrlC:
    """Ctrl-C during a cell, counted instead of raised (on the main thread, while Python's own
    handler is in place): a KeyboardInterrupt inside tpunb's or paramiko's code could leave a
    half-sent frame and a raw traceback. A press during an Inbox wait ends that wait at once
    (_Wake, raised only there); the session looks at ``presses`` after every wait."""

    def __init__(self) -> None:
        self.presses = 0
        self.waiting = False
        self._previous = None

    def __enter__(self) -> "CtrlC":
        if threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self._previous = signal.signal(signal.SIGINT, self._press)
        return self

    def _press(self, signum, frame) -> None:
        self.presses += 1
        if self.waiting:
            self.waiting = False
            raise _Wake()

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


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


class _Wake(Exception):
    """Ends an Inbox wait on Ctrl-C; never leaves the session."""
