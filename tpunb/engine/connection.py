"""One host's agent seen from the kernel: start it, ship it, hand its frames to the session.

Frames of hosts whose stream is a file descriptor are read by the session's FanIn thread (one for
every local host); the others (paramiko channels) get a reader thread of their own. Every byte
that arrives counts as a sign of life for the session's liveness watch.
"""
from __future__ import annotations

import queue
import signal
import threading
import time
from typing import TYPE_CHECKING, Callable

from tpunb.errors import HostSetupError, ProtocolError, TransportError
from tpunb.host import protocol
from tpunb.transport.bundle import BOOTSTRAP, LAUNCHER, agent_bundle, launcher_message
from tpunb.transport.seam import AgentProcess, Transport
from tpunb.transport.fanin import FanIn, Frames, Stream

if TYPE_CHECKING:
    from tpunb.transport.forkserver import LocalForks

_CHUNK = 1 << 20  # a large frame is read in pieces, each counting as a sign of life
#: marshal frames with agents that run this same Python (False: JSON with every host, as with others)
MARSHAL_FRAMES = True


class Handshake(queue.Queue):
    """One agent start's handshake frames (prepare steps, hello, ready, or died), and whether its
    hello (or its death) came: an agent says hello once IPython is imported, so a standby that
    greeted needs only its settings."""

    def __init__(self) -> None:
        super().__init__()
        self.greeted = threading.Event()

    def put(self, item, block: bool = True, timeout: float | None = None) -> None:
        super().put(item, block, timeout)
        if item.get("op") in ("hello", "died"):
            self.greeted.set()


class HostConnection:
    """One host's agent: started once per host session, then reused for every cell."""

    def __init__(self, index: int, transport: Transport, router: Callable[[int, dict, bytes], None],
                 fanin: FanIn | None = None, forks: LocalForks | None = None) -> None:
        self.index = index
        self.transport = transport
        #: the kernel's fork server of local agents (``tpunb.transport.forkserver.LocalForks``), or None
        self.forks = forks
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
        #: until then (time.monotonic) this host's silence is not judged: it is loading JAX, GIL held
        self.quiet_until = 0.0
        #: why this host was ended while no cell ran (it stopped answering): the next cell says so
        self.notice: str | None = None
        #: frames to and from this host are marshal, not JSON: its agent runs this same Python
        self.fast = False
        #: told each step of this host's environment being made (host, its ``prepare`` frame)
        self.on_prepare: Callable[[int, dict], None] | None = None
        self._handshake = Handshake()
        self._lock = threading.Lock()
        self._life = threading.Lock()  # launch, close and give_up of this host's agent, one at a time

    def launch(self, init: dict | None = None) -> None:
        """Start the agent and ship it; the handshake is finished by ``handshake``. ``init`` (the
        host's settings) travels with the bundle, so the agent never waits a round trip for it:
        inside the launcher's spec when the host's environment is prepared first (the launcher
        hands it to the agent with the bundle), else as the frame after the bundle."""
        self._init_sent = init is not None
        with self._life:
            self._handshake = Handshake()  # a fresh one: the previous agent may have left "died" in it
            self.transport.connect()  # after a lost connection, the next cell reconnects by itself
            prepare = getattr(self.transport, "prepare", None)  # a spec: make (or check) the environment first
            process = None if prepare else self.transport.spawn_agent(self.forks)  # bundle loaded already
            shipped = process is not None
            if process is None:
                process = self.transport.spawn([self.transport.python, "-c", LAUNCHER if prepare else BOOTSTRAP])
            self.process = process
            self.notice = None
            handshake = self._handshake
            fd = process.frames_fd() if self.fanin is not None else None
            if fd is not None:
                self._stream = self.fanin.add(fd, lambda frames: self._on_frames(handshake, frames),
                                              lambda reason: self._on_end(process, handshake, reason))
        if prepare:
            process.send(launcher_message(prepare, self._init_frame(init) if init is not None else None))
        if not shipped:
            process.send(agent_bundle())
        if init is not None and not prepare:
            process.send(protocol.encode(self._init_frame(init)))
        if fd is None:
            threading.Thread(target=self._read_loop, args=(process, handshake), daemon=True,
                             name=f"tpunb-host-{self.index}").start()

    @property
    def greeted(self) -> bool:
        """Its agent said hello (or ended): a handshake would not wait for it to start."""
        return self._handshake.greeted.is_set()

    def wait_greeted(self, timeout: float) -> bool:
        """Until its agent says hello (or ends); False at ``timeout`` seconds."""
        return self._handshake.greeted.wait(timeout)

    def handshake(self, init: dict, timeout: float) -> None:
        """Check the protocol version, send the host's settings, wait until it is ready. While
        the host's environment is made, its steps count as signs of life (``timeout`` is silence)."""
        hello = self._wait_handshake(timeout, "start")
        while hello.get("op") == "prepare":
            self._prepared(hello)
            hello = self._wait_handshake(timeout, "start")
        if hello.get("protocol") != protocol.PROTOCOL_VERSION:
            raise ProtocolError(f"host {self.index} runs agent protocol v{hello.get('protocol')}, "
                                f"this tpunb speaks v{protocol.PROTOCOL_VERSION}: restart the slice")
        self.info = {**dict(hello), **({"env": self.info["env"]} if "env" in self.info else {})}
        self.fast = MARSHAL_FRAMES and hello.get("magic") == protocol.MAGIC  # as the agent decides from init
        if not getattr(self, "_init_sent", False):
            self.send(self._init_frame(init))
        ready = self._wait_handshake(timeout, "get ready")
        self.info.update(runner=ready.get("runner"), runner_error=ready.get("runner_error"), inbox=ready.get("inbox"))
        self.heard_at = time.monotonic()
        self.alive = True
        self.started_at = time.time()

    @staticmethod
    def _init_frame(init: dict) -> dict:
        """The init frame: the agent speaks marshal from then on if it runs this same Python (its
        bytecode magic equals ours), which the kernel learns from its hello."""
        return {"op": "init", **init, "marshal": MARSHAL_FRAMES, "magic": protocol.MAGIC}

    def _prepared(self, message: dict) -> None:
        """A step of this host's environment: shown, recorded once ready, one line if it failed."""
        if message.get("state") == "failed":
            raise HostSetupError(self.index, self.transport.address, str(message.get("error") or "no reason given"))
        if message.get("state") == "ready":
            self.info = {"env": {k: message.get(k) for k in ("env", "python", "versions", "fresh", "seconds")}}
            self.transport.prepared_python = message.get("python")
        if self.on_prepare is not None:
            self.on_prepare(self.index, message)

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

    def send_part(self, head: bytes, blob=b"") -> None:
        """Send a frame as its encoded head and its blob (a view of a value: never copied)."""
        process = self.process
        if process is None:
            raise TransportError(f"host {self.index} is not running")
        with self._lock:
            process.send(head)
            if len(blob):
                process.send(blob)

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

    def _read_loop(self, process: AgentProcess, handshake: Handshake) -> None:
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

    def _deliver(self, handshake: Handshake, message: dict, blob: bytes) -> None:
        op = message.get("op")
        if op == "beat":
            return
        if op in ("hello", "ready", "prepare"):
            handshake.put(message)
        else:
            self.router(self.index, message, blob)

    def _on_frames(self, handshake: Handshake, frames: Frames) -> None:
        """From the session's FanIn thread: bytes arrived (a sign of life), maybe completing frames."""
        self.heard_at = time.monotonic()
        for message, blob in frames:
            self._deliver(handshake, message, blob)

    def _on_end(self, process: AgentProcess, handshake: Handshake, reason: str) -> None:
        """From the FanIn thread: telling why a host died may wait for its exit status, which
        must not hold up every other host's frames."""
        threading.Thread(target=self._ended, args=(process, handshake, reason), daemon=True,
                         name=f"tpunb-host-{self.index}-end").start()

    def _ended(self, process: AgentProcess, handshake: Handshake, reason: str) -> None:
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

    def close(self, grace: float | None = None) -> bool:
        """End the agent: end of input, and a kill if it has not exited within ``grace`` seconds
        (its transport's default); True if it had to be killed."""
        process = self.detach()
        return process.close(grace) if process is not None else False

    def detach(self, reason: str = "") -> AgentProcess | None:
        """Stop using this host's agent, which is not ended yet (``close`` ends it): from now on it
        is seen as not running, ``reason`` saying why. The agent's process, to end."""
        with self._life:
            process, self.process = self.process, None
            self.alive = False
            if reason:
                self.died_reason = reason
            self._stop_reading()
        return process


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
