"""Fan-out of one request to N agents, merge of their replies, interrupts, timeouts, deaths.

A Session owns one HostConnection per host. Each connection has a reader thread that turns the
agent's frames into events on the queue of the request they belong to. ``execute`` runs one
cell on some hosts, forwards output to a sink as it arrives, and returns per-host results; when
the kernel is interrupted, a deadline passes or a host dies, it interrupts the rest and, if they
do not stop, escalates (SIGTERM, then SIGKILL) so a cell can never hang the notebook.
"""
from __future__ import annotations

import itertools
import pickle
import queue
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from tpunb.errors import CellInterrupted, HostDiedError, ProtocolError, RemoteError, TransportError
from tpunb.host import protocol
from tpunb.host.bundle import BOOTSTRAP, agent_bundle
from tpunb.transport.base import AgentProcess, Transport


@dataclass
class HostResult:
    """What one host did with one cell."""

    host: int
    status: str = "running"  # ok | error | interrupted | timeout | died | killed | not run
    stdout: str = ""
    stderr: str = ""
    value: dict | None = None  # the last expression's mime bundle ({"text/plain": ...})
    displays: list[dict] = field(default_factory=list)
    error: dict | None = None  # {"ename", "evalue", "traceback": [lines]}
    seconds: float | None = None
    detail: str = ""  # why a host died or was killed
    exit_code: int | None = None  # shell commands (%tpu_run)

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class HostConnection:
    """One host's agent: started once per host session, then reused for every cell."""

    def __init__(self, index: int, transport: Transport, router: Callable[[int, dict, bytes], None]) -> None:
        self.index = index
        self.transport = transport
        self.router = router
        self.process: AgentProcess | None = None
        self.info: dict = {}
        self.alive = False
        self.died_reason = ""
        self.started_at: float | None = None
        self._handshake: queue.Queue = queue.Queue()
        self._lock = threading.Lock()

    def launch(self) -> None:
        """Start the agent and ship it; the handshake is finished by ``handshake``."""
        self._handshake = queue.Queue()  # a fresh one: the previous agent may have left "died" in it
        self.transport.connect()  # after a lost connection, the next cell reconnects by itself
        self.process = self.transport.spawn([self.transport.python, "-c", BOOTSTRAP])
        self.process.send(agent_bundle())
        threading.Thread(target=self._read_loop, args=(self.process, self._handshake), daemon=True,
                         name=f"tpunb-host-{self.index}").start()

    def handshake(self, init: dict, timeout: float) -> None:
        """Check the protocol version, send the host's settings, wait until it is ready."""
        hello = self._wait_handshake(timeout, "start")
        if hello.get("protocol") != protocol.PROTOCOL_VERSION:
            raise ProtocolError(f"host {self.index} runs agent protocol v{hello.get('protocol')}, "
                                f"this tpunb speaks v{protocol.PROTOCOL_VERSION}: restart the slice")
        self.info = dict(hello)
        self.send({"op": "init", **init})
        ready = self._wait_handshake(timeout, "get ready")
        self.info.update(runner=ready.get("runner"), runner_error=ready.get("runner_error"))
        self.alive = True
        self.started_at = time.time()

    def _wait_handshake(self, timeout: float, what: str) -> dict:
        try:
            message = self._handshake.get(timeout=timeout)
        except queue.Empty:
            raise TransportError(f"host {self.index} ({self.transport.address}) did not {what} "
                                 f"within {timeout:.0f} s") from None
        if message.get("op") == "died":
            tail = self.process.stderr_tail().strip() if self.process else ""
            raise TransportError(f"host {self.index} ({self.transport.address}) failed to start the agent"
                                 + (f": {tail.splitlines()[-1]}" if tail else ""))
        return message

    def send(self, message: dict, blob: bytes = b"") -> None:
        if self.process is None:
            raise TransportError(f"host {self.index} is not running")
        data = protocol.encode(message, blob)
        with self._lock:
            self.process.send(data)

    def _read_loop(self, process: AgentProcess, handshake: queue.Queue) -> None:
        reason = ""
        try:
            while True:
                frame = protocol.read_frame(process.recv_exact)
                if frame is None:
                    break
                message, blob = frame
                if message.get("op") in ("hello", "ready"):
                    handshake.put(message)
                else:
                    self.router(self.index, message, blob)
        except (EOFError, ValueError, TransportError, OSError) as exc:
            reason = f"broken stream: {exc}"
        handshake.put({"op": "died"})
        if process is not self.process:
            return  # an old agent that was replaced or closed on purpose
        self.alive = False
        self.died_reason = reason or describe_exit(process)
        self.router(self.index, {"op": "died", "id": None, "reason": self.died_reason}, b"")

    def signal(self, sig: int) -> None:
        pgid = self.info.get("pgid")
        if self.process is not None and pgid:
            self.process.signal_group(pgid, sig)

    def close(self) -> None:
        process, self.process = self.process, None
        self.alive = False
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
        self.transports = transports
        self.init_for_host = init_for_host
        self.start_timeout = start_timeout
        self.hosts = [HostConnection(i, t, self._route) for i, t in enumerate(transports)]
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
        """Start agents on these hosts (default all) in parallel."""
        chosen = [self.hosts[i] for i in (indices if indices is not None else range(len(self.hosts)))]
        for host in chosen:
            host.close()
            host.launch()
        errors = []
        threads = []
        for host in chosen:
            def shake(h=host):
                try:
                    h.handshake(self.init_for_host(h.index), self.start_timeout)
                except Exception as exc:  # collected and reported together below
                    errors.append(exc)
            thread = threading.Thread(target=shake, daemon=True)
            thread.start()
            threads.append(thread)
        for thread in threads:
            thread.join()
        if errors:
            for host in chosen:
                host.close()
            raise errors[0] if len(errors) == 1 else TransportError("; ".join(str(e) for e in errors))

    def close(self) -> None:
        for host in self.hosts:
            host.close()

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

    def _request(self) -> tuple[int, queue.Queue]:
        rid = next(self._ids)
        waiter: queue.Queue = queue.Queue()
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
        try:
            for i in indices:
                try:
                    self.hosts[i].send({**request, "id": rid})
                    pending.add(i)
                except TransportError as exc:
                    results[i].status, results[i].detail = "died", str(exc)
            deadline = time.monotonic() + timeout if timeout else None
            try:
                self._collect(rid, waiter, pending, results, sink, deadline)
            except _Deadline:
                self._stop(rid, waiter, pending, results, sink, "timeout")
            except _HostDied:
                self._stop(rid, waiter, pending, results, sink, "interrupted")
            except KeyboardInterrupt:
                self._stop(rid, waiter, pending, results, sink, "interrupted")
                raise CellInterrupted("the cell was interrupted on every host", results) from None
        finally:
            self._forget(rid)
        return results

    def _collect(self, rid, waiter, pending, results, sink, deadline, stop_on_death=True) -> None:
        while pending:
            wait = 0.1 if deadline is None else max(0.0, min(0.1, deadline - time.monotonic()))
            try:
                index, message, blob = waiter.get(timeout=wait)
            except queue.Empty:
                sink.tick()
                if deadline is not None and time.monotonic() >= deadline:
                    raise _Deadline() from None
                continue
            if index not in results:
                continue
            self._apply(index, message, results[index], sink, pending)
            if message.get("op") == "died" and stop_on_death and pending:
                raise _HostDied()

    def _apply(self, index: int, message: dict, result: HostResult, sink: OutputSink, pending: set) -> None:
        op = message.get("op")
        if op == "stream":
            if message["name"] == "stderr":
                result.stderr += message["text"]
            else:
                result.stdout += message["text"]
            sink.stream(index, message["name"], message["text"])
        elif op == "display":
            result.displays.append(message["data"])
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
            pending.discard(index)
            sink.host_done(index)
        elif op == "died" and index in pending:
            result.status, result.detail = "died", message.get("reason", "")
            pending.discard(index)
            sink.host_done(index)

    def _stop(self, rid, waiter, pending, results, sink, status: str) -> None:
        """Interrupt the hosts still running, then escalate on those that do not stop."""
        for i in list(pending):
            try:
                self.hosts[i].send({"op": "interrupt", "id": rid})
            except TransportError:
                pass
        marked = set(pending)
        deadline = time.monotonic() + self.interrupt_grace
        try:
            self._collect(rid, waiter, pending, results, sink, deadline, stop_on_death=False)
        except (_Deadline, KeyboardInterrupt):  # a second Ctrl-C escalates at once
            pass
        if pending:
            self._escalate(rid, waiter, pending, results, sink)
        for i in marked:
            if results[i].status == "interrupted" and status == "timeout":
                results[i].status = "timeout"

    def _escalate(self, rid, waiter, pending, results, sink) -> None:
        stuck = sorted(pending)
        for sig, grace in ((signal.SIGTERM, self.term_grace), (signal.SIGKILL, self.term_grace)):
            for i in sorted(pending):
                self.hosts[i].signal(sig)
            deadline = time.monotonic() + grace
            try:
                self._collect(rid, waiter, pending, results, sink, deadline, stop_on_death=False)
            except (_Deadline, KeyboardInterrupt):
                pass
            if not pending:
                break
        for i in stuck:
            results[i].status = "killed"
            results[i].detail = "did not stop when interrupted and was killed"
        for i in list(pending):  # unreachable even by SIGKILL: drop the connection
            self.hosts[i].close()
            pending.discard(i)

    # -- data ---------------------------------------------------------------------------------
    def call(self, indices: list[int], message: dict, blob: bytes = b"", timeout: float = 60.0) -> dict[int, tuple[dict, bytes]]:
        """A short request to several hosts; raises TransportError naming hosts that failed."""
        rid, waiter = self._request()
        replies: dict[int, tuple[dict, bytes]] = {}
        try:
            pending = set()
            for i in indices:
                self.hosts[i].send({**message, "id": rid}, blob)
                pending.add(i)
            deadline = time.monotonic() + timeout
            while pending:
                try:
                    index, reply, data = waiter.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    raise TransportError(f"hosts {sorted(pending)} did not answer {message['op']} "
                                         f"within {timeout:.0f} s") from None
                if reply.get("op") == "died" and index in pending:
                    raise HostDiedError(f"host {index} died ({reply.get('reason')})")
                if reply.get("op") == "done" and index in pending:
                    replies[index] = (reply, data)
                    pending.discard(index)
        finally:
            self._forget(rid)
        return replies

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
    """cloudpickle when present (lambdas, notebook classes), else pickle."""
    try:
        import cloudpickle
        return cloudpickle.dumps(values, protocol=4)
    except ImportError:
        return pickle.dumps(values, protocol=4)


class _Deadline(Exception):
    pass


class _HostDied(Exception):
    pass
