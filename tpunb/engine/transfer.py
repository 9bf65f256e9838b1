"""Values moving between the notebook and its hosts: pickled once, sent without copies.

A pushed value is pickled once for every host with protocol 5, its arrays kept out of band (not
copied). Up to ``transfer.INLINE`` bytes it travels in the request frame itself. Hosts on this
machine (a local slice) map one memfd the kernel writes once; other hosts get ``part`` frames
of at most 2 MB, one sending thread per host, so heartbeats, interrupts and other frames pass
between the pieces, and a Ctrl-C stops every sender after its current piece
(the hosts drop what arrived). Pulls come back the same two ways. Values over ``BAR_BYTES`` show
a progress bar (bytes, rate, ETA).
"""
from __future__ import annotations

import contextlib
import functools
import os
import sys
import threading
from typing import TYPE_CHECKING, Any

from tpunb.errors import TransportError, UsageError
from tpunb.host import protocol, transfer
from tpunb.host.transfer import Assembly

if TYPE_CHECKING:
    from tpunb.engine.connection import HostConnection
    from tpunb.engine.ctrl_c import CtrlC, Inbox

#: values this large or larger show a progress bar
BAR_BYTES = 16 << 20


def pack(values: dict) -> list[memoryview]:
    """``values`` as pickle 5 segments (cloudpickle when present: lambdas, notebook classes);
    jax.Arrays travel as numpy. A value that cannot be sent is named in a one-line UsageError."""
    keep: list = []  # arrays the segments view, alive until they are sent
    pickler = functools.partial(_pickler_class(), keep=keep)
    try:
        return _Segments(transfer.dumps(values, pickler), keep)
    except Exception:
        for name, value in values.items():
            try:
                transfer.dumps(value, pickler)
            except Exception as exc:
                raise UsageError(f"cannot send {name} to the hosts: {type(exc).__name__}: {exc} "
                                 "(send what it is made from, and rebuild it there)") from None
        raise


def code_by_value(values: dict) -> list[str]:
    """The names whose pickle carries a function or class by value (defined in the notebook, a
    lambda, a closure): cloudpickle loads those only on the same Python version."""
    try:
        import cloudpickle
    except ImportError:
        return []
    import io
    import types

    class Finder(cloudpickle.Pickler):
        found = False

        def reducer_override(self, obj):
            reduced = super().reducer_override(obj)
            if reduced is not NotImplemented and isinstance(obj, (types.FunctionType, type)):
                Finder.found = True
            return reduced

    names = []
    for name, value in values.items():
        Finder.found = False
        try:
            Finder(io.BytesIO(), protocol=5, buffer_callback=lambda buffer: None).dump(value)
        except Exception:  # pack() names a value that cannot be sent at all
            continue
        if Finder.found:
            names.append(name)
    return names


class _Segments(list):
    def __init__(self, segments: list, keep: list) -> None:
        super().__init__(segments)
        self.keep = keep


@functools.lru_cache(maxsize=None)
def _pickler_class():
    """cloudpickle's Pickler (else pickle's) that sends jax.Arrays as numpy, and read-only
    arrays as arrays the hosts may write to."""
    try:
        import cloudpickle
        base = cloudpickle.Pickler
    except ImportError:
        import pickle
        base = pickle.Pickler

    class Pickler(base):
        def __init__(self, *args, keep: list, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.keep = keep

        def reducer_override(self, obj):
            numpy = sys.modules.get("numpy")
            jax = sys.modules.get("jax")
            if jax is not None and isinstance(obj, jax.Array):
                obj = numpy.asarray(obj)
            if numpy is not None and type(obj) is numpy.ndarray and not obj.flags.writeable and obj.flags.c_contiguous:
                return obj.__reduce_ex__(5)[0], (*_writable_args(obj, self.keep, numpy),)
            parent = getattr(super(), "reducer_override", None)
            return parent(obj) if parent is not None else NotImplemented

    return Pickler


def _writable_args(array, keep: list, numpy) -> tuple:
    """numpy's own pickle 5 arguments for a read-only array (jax's are), over a writable view of
    the same memory: pickle marks a read-only buffer so, and the host's copy would be read-only
    too. The view is only read here."""
    import ctypes

    keep.append(array)
    raw = (ctypes.c_char * max(array.nbytes, 1)).from_address(array.ctypes.data)
    view = numpy.frombuffer(raw, numpy.uint8, array.nbytes).view(array.dtype).reshape(array.shape)
    return view.__reduce_ex__(5)[1]


def shares_memory(host: HostConnection) -> bool:
    """The host's agent runs on this machine (a local slice): it can map this process's memfds."""
    return (bool(getattr(host.process, "same_machine", False)) and transfer.can_share() and bool(host.info.get("pid"))
            and not host.info.get("unshared"))


def memfd_owner() -> int:
    """The process whose memfds hosts open (through /proc/PID/fd)."""
    return os.getpid()


class Meter:
    """Bytes moved by a request, from any thread; a tqdm.auto bar once a value of BAR_BYTES or
    more is seen (never for smaller ones)."""

    def __init__(self, description: str) -> None:
        self.description = description
        self.done = self.total = 0
        self._lock = threading.Lock()
        self._stack = contextlib.ExitStack()
        self._update = None

    def expect(self, nbytes: int, value_bytes: int) -> None:
        with self._lock:
            self.total += nbytes
            if self._update is None and value_bytes >= BAR_BYTES:
                from tpunb.widgets.progress import byte_progress
                self._update = self._stack.enter_context(byte_progress(self.description))
            self._show()

    def add(self, nbytes: int) -> None:
        with self._lock:
            self.done += nbytes
            self._show()

    def _show(self) -> None:
        if self._update is not None:
            self._update(min(self.done, self.total), self.total)

    def close(self) -> None:
        with self._lock:
            self._stack.close()
            self._update = None


class Transfer:
    """The data side of one request: what it sends, what it receives, and how it stops."""

    def __init__(self, rid: int, inbox: Inbox, ctrl_c: CtrlC, description: str) -> None:
        self.rid, self.inbox, self.ctrl_c = rid, inbox, ctrl_c
        self.meter = Meter(description)
        self.stopped = threading.Event()
        self.seen = 0  # bytes moved when the request last looked (it waits on while they flow)
        self._memfd: int | None = None
        self._streaming: set[int] = set()  # hosts a thread still sends parts to
        self._request: dict = {}
        self._segments: list[memoryview] = []
        self._arriving: dict[int, Assembly] = {}

    # -- out ------------------------------------------------------------------------------------
    def send(self, hosts: list[HostConnection], message: dict, segments: list[memoryview]) -> bool:
        """Send ``message`` with the value to every host (memfd or parts); False if Ctrl-C stopped it."""
        sizes = [len(s) for s in segments]
        size = sum(sizes)
        self._request, self._segments = {**message, "id": self.rid, "sizes": sizes}, segments
        shared = [h for h in hosts if shares_memory(h)]
        streamed = [h for h in hosts if h not in shared]
        self.meter.expect(size * len(streamed) + (size if shared else 0), size)
        for host in streamed:
            self.stream(host)
        if shared:
            self._memfd = transfer.write_memfd(segments, lambda: self.ctrl_c.presses > 0, self.meter.add)
            if self._memfd is None:
                return False
            with_fd = {**self._request, "shm": [memfd_owner(), self._memfd]}
            for host in shared:
                self._send(host, with_fd)
        return True

    def send_stripes(self, stripes: list[tuple[HostConnection, dict, int, int]], segments: list[memoryview]) -> None:
        """Send each (host, message, lo, hi) the layout's bytes [lo, hi) of the value as parts, then
        its message, every host on a thread of its own (a relay's roots: each byte sent once)."""
        sizes = [len(s) for s in segments]
        self._segments = segments
        self.meter.expect(sum(hi - lo for _, _, lo, hi in stripes), sum(sizes))
        for host, message, lo, hi in stripes:
            self._start(host, {**message, "id": self.rid, "sizes": sizes}, segments, (lo, hi))

    def stream(self, host: HostConnection) -> None:
        """Send the value to this host in parts, on a thread of its own (also for a host that could
        not map the memfd: it says so, and is sent parts from then on)."""
        if host.info.get("unshared"):
            self.meter.expect(sum(self._request["sizes"]), 0)
        self._start(host, self._request, self._segments)

    def _start(self, host: HostConnection, request: dict, segments: list[memoryview], span=None) -> None:
        """This host's sending thread: its parts (of bytes [lo, hi) given a ``span``), then ``request``."""
        self._streaming.add(host.index)
        threading.Thread(target=self._stream, args=(host, request, segments, span), daemon=True,
                         name=f"tpunb-push-{host.index}").start()

    def _stream(self, host: HostConnection, request: dict, segments: list[memoryview], span=None) -> None:
        try:
            self._stream_parts(host, request, segments, span)
        finally:
            self._streaming.discard(host.index)

    def _stream_parts(self, host: HostConnection, request: dict, segments: list[memoryview], span=None) -> None:
        """One host's parts (of bytes [lo, hi) given a ``span``), then the request; on stop, an
        interrupt that makes it drop the parts."""
        sizes, first = request["sizes"], True
        for at, piece in (transfer.clipped(segments, *span) if span else transfer.pieces(segments)):
            if self.stopped.is_set():
                self._send(host, {"op": "interrupt", "id": self.rid})
                return
            head = {"op": "part", "id": self.rid, "at": at, **({"sizes": sizes} if first else {})}
            first = False
            if not self._send(host, head, piece):
                return
            self.meter.add(len(piece))
        self._send(host, request)

    def _send(self, host: HostConnection, message: dict, blob=b"") -> bool:
        """Send one frame; a host that cannot take it counts as died for this request."""
        try:
            host.send_part(protocol.encode_head(message, len(blob), host.fast), blob)
            return True
        except TransportError as exc:
            self.inbox.put((host.index, {"op": "died", "id": self.rid, "reason": str(exc)}, b""))
            return False

    # -- in -------------------------------------------------------------------------------------
    def take_part(self, index: int, message: dict, blob: bytes) -> None:
        """A piece of a host's reply."""
        if "sizes" in message:
            self._arriving[index] = Assembly(message["sizes"])
            total = sum(message["sizes"])
            self.meter.expect(total, total)
        assembly = self._arriving.get(index)
        if assembly is not None:
            self.meter.add(assembly.add(message["at"], blob))

    def value(self, host: HostConnection, reply: dict, blob: bytes) -> Any:
        """The value a host's ``done`` reply carries (in its blob, its memfd or its parts)."""
        if reply.get("inline"):
            return transfer.loads(transfer.views(bytearray(blob), reply["sizes"]))
        if "shm" in reply:
            pid, fd = reply["shm"]
            try:
                segments = transfer.map_memfd(pid, fd, reply["sizes"])
            except OSError as exc:
                raise TransportError(f"cannot map host {host.index}'s value here ({exc}): "
                                     "check that this kernel may read /proc of its host processes") from None
            finally:
                try:
                    host.send({"op": "release", "fd": fd})
                except Exception:  # a host gone since: its memfd went with it
                    pass
            total = sum(reply["sizes"])
            self.meter.expect(total, total)
            self.meter.add(total)
            return transfer.loads(segments)
        assembly = self._arriving.pop(host.index, None)
        if assembly is None or not assembly.complete:
            raise TransportError(f"host {host.index}'s value did not arrive whole: pull it again")
        return transfer.loads(assembly.segments())

    # -- end ------------------------------------------------------------------------------------
    def stop(self, hosts: list[HostConnection]) -> None:
        """Ctrl-C: senders stop after their current piece (and tell their hosts); hosts sending
        to us are told to stop."""
        self.stopped.set()
        for host in hosts:
            if host.index not in self._streaming and host.alive:
                with contextlib.suppress(Exception):
                    host.send({"op": "interrupt", "id": self.rid})

    def close(self) -> None:
        """Free what the request held: the memfd, the bar, the sending threads (each stops after
        its current piece and tells its host to drop what it has)."""
        self.stopped.set()
        if self._memfd is not None:
            os.close(self._memfd)
            self._memfd = None
        self._arriving.clear()
        self.meter.close()
